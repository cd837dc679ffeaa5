// The TLS ClientHello as the egress proxy peeks it (runtime/protocols/client_hello.hpp): a real
// one captured from Python's ssl module, and hellos built field by field to name their server in
// upper case, with a trailing dot, not at all, badly, or behind ECH; split across records and cut
// at every byte; too large for the peek; not TLS; with lengths that do not add up.
#include "protocols/client_hello.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace rlm::protocols {
namespace {

using Bytes = std::vector<std::uint8_t>;

// What Python 3.11's ssl (OpenSSL 3.0) sent for
// create_default_context().wrap_socket(sock, server_hostname="PyPI.test"): one record of 512
// bytes, TLS 1.3 and 1.2 suites, a key share, padding to 512.
constexpr const char* kPythonHelloHex =
    "1603010200010001fc0303039fbdad77e20c22be890bfe08b7a51cf9ba07f18d7122cd8f0cbac4b7623ffe2023e8"
    "ae01941e97cae6f43d19dcda6765935083ae19eac96518e400472cfcdc260024130213031301c02cc030c02bc02f"
    "cca9cca8c024c028c023c027009f009e006b006700ff0100018f0000000e000c000009507950492e74657374000b"
    "000403000102000a00160014001d0017001e0019001801000101010201030104002300000016000000170000000d"
    "002a0028040305030603080708080809080a080b080408050806040105010601030303010302040205020602002b"
    "00050403040303002d00020101003300260024001d00208b6989f3078d7205997afc1effd68c5530ead107efba0c"
    "43a49077c03e92b70a001500e4000000000000000000000000000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000";

Bytes from_hex(std::string_view hex) {
  Bytes bytes;
  for (std::size_t at = 0; at + 1 < hex.size(); at += 2)
    bytes.push_back(
        static_cast<std::uint8_t>(std::stoi(std::string(hex.substr(at, 2)), nullptr, 16)));
  return bytes;
}

void put_u16(Bytes& out, std::size_t value) {
  out.push_back(static_cast<std::uint8_t>(value >> 8));
  out.push_back(static_cast<std::uint8_t>(value));
}

void put_u24(Bytes& out, std::size_t value) {
  out.push_back(static_cast<std::uint8_t>(value >> 16));
  put_u16(out, value);
}

Bytes text(std::string_view chars) {
  return Bytes(chars.begin(), chars.end());
}

// A server_name extension's data: the list of (type, name) entries.
Bytes server_names(const std::vector<std::pair<std::uint8_t, std::string>>& names) {
  Bytes list;
  for (const auto& [type, name] : names) {
    list.push_back(type);
    put_u16(list, name.size());
    list.insert(list.end(), name.begin(), name.end());
  }
  Bytes data;
  put_u16(data, list.size());
  data.insert(data.end(), list.begin(), list.end());
  return data;
}

// A ClientHello, field by field (RFC 8446 4.1.2), and the records that carry it.
struct HelloBuilder {
  std::size_t legacy_version = 0x0303;
  Bytes session_id = Bytes(32, 0x5a);
  Bytes cipher_suites = {0x13, 0x01, 0x13, 0x02, 0xc0, 0x2f};
  Bytes compression_methods = {0};
  std::vector<std::pair<std::uint16_t, Bytes>> extensions;
  bool extensions_block = true;

  HelloBuilder& sni(const std::string& name) {
    return extension(kTlsExtensionServerName, server_names({{0, name}}));
  }
  HelloBuilder& extension(std::uint16_t type, Bytes data) {
    extensions.emplace_back(type, std::move(data));
    return *this;
  }
  // Padding (RFC 7685) to make the hello `bytes` long or so.
  HelloBuilder& padding(std::size_t bytes) { return extension(21, Bytes(bytes, 0)); }

  Bytes handshake() const {
    Bytes body;
    put_u16(body, legacy_version);
    body.insert(body.end(), 32, 0x11);  // random
    body.push_back(static_cast<std::uint8_t>(session_id.size()));
    body.insert(body.end(), session_id.begin(), session_id.end());
    put_u16(body, cipher_suites.size());
    body.insert(body.end(), cipher_suites.begin(), cipher_suites.end());
    body.push_back(static_cast<std::uint8_t>(compression_methods.size()));
    body.insert(body.end(), compression_methods.begin(), compression_methods.end());
    if (extensions_block) {
      Bytes block;
      for (const auto& [type, data] : extensions) {
        put_u16(block, type);
        put_u16(block, data.size());
        block.insert(block.end(), data.begin(), data.end());
      }
      put_u16(body, block.size());
      body.insert(body.end(), block.begin(), block.end());
    }
    Bytes message = {1};
    put_u24(message, body.size());
    message.insert(message.end(), body.begin(), body.end());
    return message;
  }

  // The handshake in records of at most `fragment` bytes each.
  Bytes records(std::size_t fragment = 16384) const { return records_of(handshake(), fragment); }

  static Bytes records_of(const Bytes& handshake, std::size_t fragment = 16384) {
    Bytes stream;
    for (std::size_t at = 0; at < handshake.size(); at += fragment) {
      const std::size_t length = std::min(fragment, handshake.size() - at);
      stream.insert(stream.end(), {22, 3, 1});
      put_u16(stream, length);
      stream.insert(stream.end(), handshake.begin() + static_cast<std::ptrdiff_t>(at),
                    handshake.begin() + static_cast<std::ptrdiff_t>(at + length));
    }
    return stream;
  }
};

HelloVerdict verdict_of(const Bytes& stream, std::size_t max_bytes = 16384) {
  ClientHello hello;
  return parse_client_hello(stream, max_bytes, hello);
}

ClientHello complete(const Bytes& stream) {
  ClientHello hello;
  EXPECT_EQ(parse_client_hello(stream, 16384, hello), HelloVerdict::complete);
  return hello;
}

TEST(ClientHello, PythonsRealHelloNamesItsServerLowercased) {
  const Bytes stream = from_hex(kPythonHelloHex);
  ASSERT_EQ(stream.size(), 517u);
  const ClientHello hello = complete(stream);
  EXPECT_EQ(hello.server_name, "pypi.test");
  EXPECT_FALSE(hello.server_name_invalid);
  EXPECT_FALSE(hello.encrypted_client_hello);
  EXPECT_EQ(hello.bytes, 517u);
}

TEST(ClientHello, EveryPrefixOfARealHelloAsksForMore) {
  const Bytes stream = from_hex(kPythonHelloHex);
  for (std::size_t length = 0; length < stream.size(); ++length)
    EXPECT_EQ(
        verdict_of(Bytes(stream.begin(), stream.begin() + static_cast<std::ptrdiff_t>(length))),
        HelloVerdict::need_more)
        << length;
}

TEST(ClientHello, AHelloSplitAcrossRecordsIsReassembledAtEverySplit) {
  // The real hello's handshake message re-cut into records of every size from 1 byte up.
  const Bytes real = from_hex(kPythonHelloHex);
  const Bytes handshake(real.begin() + 5, real.end());
  for (std::size_t fragment = 1; fragment <= handshake.size(); fragment += fragment < 40 ? 1 : 37) {
    const Bytes stream = HelloBuilder::records_of(handshake, fragment);
    const ClientHello hello = complete(stream);
    EXPECT_EQ(hello.server_name, "pypi.test") << fragment;
    EXPECT_EQ(hello.bytes, stream.size()) << fragment;
  }
}

TEST(ClientHello, EveryPrefixOfAHelloInThreeRecordsAsksForMore) {
  const Bytes stream = HelloBuilder().sni("pypi.org").padding(300).records(150);
  ASSERT_GT(stream.size(), 2 * (150 + 5u));
  for (std::size_t length = 0; length < stream.size(); ++length)
    ASSERT_EQ(
        verdict_of(Bytes(stream.begin(), stream.begin() + static_cast<std::ptrdiff_t>(length))),
        HelloVerdict::need_more)
        << length;
  EXPECT_EQ(complete(stream).server_name, "pypi.org");
}

TEST(ClientHello, WhatFollowsTheHelloIsNotCounted) {
  Bytes stream = HelloBuilder().sni("pypi.org").records();
  const std::size_t hello_bytes = stream.size();
  stream.insert(stream.end(), {0x14, 3, 3, 0, 1, 1, 0x17, 3, 3, 0, 2, 0xaa, 0xbb});  // CCS, data
  EXPECT_EQ(complete(stream).bytes, hello_bytes);
}

TEST(ClientHello, TheServerNameIsLowercasedWithoutItsTrailingDot) {
  EXPECT_EQ(complete(HelloBuilder().sni("Files.PythonHosted.ORG.").records()).server_name,
            "files.pythonhosted.org");
  EXPECT_EQ(complete(HelloBuilder().sni("under_score-1.test").records()).server_name,
            "under_score-1.test");
}

TEST(ClientHello, AHelloWithoutServerNameSaysSo) {
  const ClientHello hello = complete(HelloBuilder().padding(10).records());
  EXPECT_FALSE(hello.server_name.has_value());
  EXPECT_FALSE(hello.server_name_invalid);
  // Nor without any extension at all (a TLS 1.0 client may send none).
  HelloBuilder bare;
  bare.extensions_block = false;
  EXPECT_FALSE(complete(bare.records()).server_name.has_value());
}

TEST(ClientHello, AServerNameThatIsNotOneHostIsFlagged) {
  const std::vector<Bytes> invalid = {
      server_names({{0, std::string("pypi.org\0x", 10)}}),
      server_names({{0, "pypi org"}}),
      server_names({{0, ""}}),
      server_names({{0, "."}}),
      server_names({{0, "a..b"}}),
      server_names({{0, std::string(256, 'a')}}),
      server_names({{0, "pypi.org"}, {0, "evil.test"}}),  // two host_names
      server_names({{1, "pypi.org"}}),                    // no host_name
      server_names({}),
  };
  for (std::size_t i = 0; i < invalid.size(); ++i) {
    const ClientHello hello = complete(HelloBuilder().extension(0, invalid[i]).records());
    EXPECT_TRUE(hello.server_name_invalid) << i;
    EXPECT_EQ(hello.server_name, "") << i;
  }
}

TEST(ClientHello, EncryptedClientHelloIsReported) {
  const ClientHello hello = complete(
      HelloBuilder().sni("public.example").extension(kTlsExtensionEch, Bytes(40, 7)).records());
  EXPECT_TRUE(hello.encrypted_client_hello);
  EXPECT_EQ(hello.server_name, "public.example") << "the outer, public name";
}

TEST(ClientHello, BytesThatAreNotATlsHandshakeAreNotTls) {
  EXPECT_EQ(verdict_of(text("G")), HelloVerdict::not_tls) << "decided on one byte";
  EXPECT_EQ(verdict_of(text("GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n")), HelloVerdict::not_tls);
  EXPECT_EQ(verdict_of({22, 0x47}), HelloVerdict::not_tls);
  EXPECT_EQ(verdict_of({22, 3, 4}), HelloVerdict::not_tls) << "record version past 0x0303";
  EXPECT_EQ(verdict_of({22, 3, 0}), HelloVerdict::not_tls) << "SSL 3.0";
  EXPECT_EQ(verdict_of({0x17, 3, 3, 0, 1, 0}), HelloVerdict::not_tls) << "application data";
  // A handshake record, but a ServerHello in it.
  Bytes server_hello = HelloBuilder().records();
  server_hello[5] = 2;
  EXPECT_EQ(verdict_of(server_hello), HelloVerdict::not_tls);
  EXPECT_EQ(verdict_of({22, 3, 1, 0, 4, 2}), HelloVerdict::not_tls) << "decided on its first byte";
  EXPECT_EQ(verdict_of({}), HelloVerdict::need_more);
  EXPECT_EQ(verdict_of({22}), HelloVerdict::need_more);
}

TEST(ClientHello, AHelloPastTheLimitIsTooLarge) {
  const Bytes stream = HelloBuilder().sni("pypi.org").padding(1000).records(500);
  EXPECT_EQ(verdict_of(stream, stream.size()), HelloVerdict::complete);
  EXPECT_EQ(verdict_of(stream, stream.size() - 1), HelloVerdict::too_large);
  // Known from the record header alone, and from the handshake header before its records come.
  EXPECT_EQ(verdict_of(Bytes(stream.begin(), stream.begin() + 5), 400), HelloVerdict::too_large);
  EXPECT_EQ(verdict_of(Bytes(stream.begin(), stream.begin() + 9), 600), HelloVerdict::too_large);
  EXPECT_EQ(verdict_of(Bytes(stream.begin(), stream.begin() + 9), 2000), HelloVerdict::need_more);
}

TEST(ClientHello, LengthsThatDoNotAddUpAreMalformed) {
  const Bytes good = HelloBuilder().sni("pypi.org").records();
  EXPECT_EQ(verdict_of({22, 3, 1, 0, 0}), HelloVerdict::malformed) << "an empty record";
  EXPECT_EQ(verdict_of({22, 3, 1, 0x40, 0x01}), HelloVerdict::malformed) << "a record over 2^14";

  HelloBuilder long_session;
  long_session.session_id = Bytes(33, 1);
  EXPECT_EQ(verdict_of(long_session.records()), HelloVerdict::malformed);
  HelloBuilder odd_suites;
  odd_suites.cipher_suites = {0x13, 0x01, 0x13};
  EXPECT_EQ(verdict_of(odd_suites.records()), HelloVerdict::malformed);
  HelloBuilder no_suites;
  no_suites.cipher_suites = {};
  EXPECT_EQ(verdict_of(no_suites.records()), HelloVerdict::malformed);
  HelloBuilder no_compression;
  no_compression.compression_methods = {};
  EXPECT_EQ(verdict_of(no_compression.records()), HelloVerdict::malformed);
  HelloBuilder version_two;
  version_two.legacy_version = 0x0200;
  EXPECT_EQ(verdict_of(version_two.records()), HelloVerdict::malformed);

  // The extensions block one byte longer than what is left; an extension past the block.
  Bytes handshake = HelloBuilder().sni("pypi.org").handshake();
  const std::size_t block_length_at = 4 + 2 + 32 + 1 + 32 + 2 + 6 + 1 + 1;
  handshake[block_length_at + 1] += 1;
  EXPECT_EQ(verdict_of(HelloBuilder::records_of(handshake)), HelloVerdict::malformed);
  handshake = HelloBuilder().sni("pypi.org").handshake();
  handshake[block_length_at + 2 + 3] += 1;  // server_name's length
  EXPECT_EQ(verdict_of(HelloBuilder::records_of(handshake)), HelloVerdict::malformed);

  // A server_name list whose length is not its data's.
  Bytes names = server_names({{0, "pypi.org"}});
  names[1] += 1;
  EXPECT_EQ(verdict_of(HelloBuilder().extension(0, names).records()), HelloVerdict::malformed);
  names = server_names({{0, "pypi.org"}});
  names[4] += 1;  // the host_name's length
  EXPECT_EQ(verdict_of(HelloBuilder().extension(0, names).records()), HelloVerdict::malformed);
  EXPECT_EQ(verdict_of(HelloBuilder().extension(0, {}).records()), HelloVerdict::malformed);

  // The same extension twice: which one would the server read?
  EXPECT_EQ(verdict_of(HelloBuilder().sni("pypi.org").sni("evil.test").records()),
            HelloVerdict::malformed);
  EXPECT_EQ(verdict_of(HelloBuilder().padding(1).padding(1).records()), HelloVerdict::malformed);

  // The handshake header's length shorter than the hello: bytes after it in the record.
  handshake = HelloBuilder().sni("pypi.org").handshake();
  handshake[3] -= 1;
  EXPECT_EQ(verdict_of(HelloBuilder::records_of(handshake)), HelloVerdict::malformed);
  // The hello's second record something other than handshake.
  Bytes split = HelloBuilder().sni("pypi.org").records(40);
  split[5 + 40] = 0x17;
  EXPECT_EQ(verdict_of(split), HelloVerdict::malformed);
  split[5 + 40] = 22;
  split[5 + 40 + 2] = 9;
  EXPECT_EQ(verdict_of(split), HelloVerdict::malformed) << "a record version out of range";
  EXPECT_EQ(verdict_of(good), HelloVerdict::complete);
}

TEST(ClientHello, AVerdictOtherThanCompleteLeavesTheHelloEmpty) {
  ClientHello hello;
  hello.server_name = "left.over";
  Bytes stream = HelloBuilder().sni("pypi.org").sni("pypi.org").records();
  EXPECT_EQ(parse_client_hello(stream, 16384, hello), HelloVerdict::malformed);
  EXPECT_FALSE(hello.server_name.has_value());
  EXPECT_EQ(hello.bytes, 0u);
}

}  // namespace
}  // namespace rlm::protocols
