#include "egress/tls_authority.hpp"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cstring>

#include "egress/tls_stream.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::egress {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertificateFree {
  void operator()(X509* certificate) const { X509_free(certificate); }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Certificate = std::unique_ptr<X509, CertificateFree>;

// Long enough for any session; the key dies with the sandbox's host side long before.
constexpr long kValiditySeconds = 30L * 24 * 3600;

[[noreturn]] void fail(const std::string& what) {
  const unsigned long code = ERR_get_error();
  char text[256] = "unknown error";
  if (code != 0) ERR_error_string_n(code, text, sizeof text);
  ERR_clear_error();
  throw Error("egress: cannot make the sandbox's certificate authority (" + what + "): " + text);
}

Key new_key() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) fail("key");
  return key;
}

void add_extension(X509* certificate, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, certificate, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value.c_str());
  if (!extension) fail(OBJ_nid2sn(nid));
  const int added = X509_add_ext(certificate, extension, -1);
  X509_EXTENSION_free(extension);
  if (!added) fail(OBJ_nid2sn(nid));
}

// A certificate for `key` named `common_name`, issued by `issuer` (itself when null), with a
// random 64-bit serial; signed once its extensions are added.
Certificate new_certificate(EVP_PKEY* key, const std::string& common_name, X509* issuer) {
  Certificate certificate(X509_new());
  if (!certificate || !X509_set_version(certificate.get(), 2)) fail("certificate");
  BIGNUM* serial = BN_new();
  const bool numbered = serial && BN_rand(serial, 64, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) &&
                        BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(certificate.get()));
  BN_free(serial);
  if (!numbered) fail("serial");
  if (!X509_gmtime_adj(X509_getm_notBefore(certificate.get()), -3600) ||
      !X509_gmtime_adj(X509_getm_notAfter(certificate.get()), kValiditySeconds) ||
      !X509_set_pubkey(certificate.get(), key))
    fail("validity");
  X509_NAME* subject = X509_get_subject_name(certificate.get());
  const auto* text = reinterpret_cast<const unsigned char*>(common_name.c_str());
  if (!X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_ASC,
                                  reinterpret_cast<const unsigned char*>("rlm-sandbox"), -1, -1,
                                  0) ||
      !X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, text, -1, -1, 0))
    fail("subject");
  if (!X509_set_issuer_name(certificate.get(),
                            X509_get_subject_name(issuer ? issuer : certificate.get())))
    fail("issuer");
  return certificate;
}

std::string pem_of(X509* certificate) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (!bio || !PEM_write_bio_X509(bio.get(), certificate)) fail("PEM");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(size));
}

// Only HTTP/1.1 is spoken where a credential is added: a client that offers ALPN must offer it.
int select_http1(SSL*, const unsigned char** out, unsigned char* out_length,
                 const unsigned char* offered, unsigned int offered_length, void*) {
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, out_length, kAlpnHttp1, sizeof kAlpnHttp1, offered,
                            offered_length) != OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

void SslContextFree::operator()(SSL_CTX* context) const {
  SSL_CTX_free(context);
}

TlsAuthority::TlsAuthority(const std::vector<std::string>& names) {
  if (names.empty()) throw Error("egress: a certificate authority for no names");
  const Key ca_key = new_key();
  const Certificate ca = new_certificate(ca_key.get(), "rlm-sandbox egress CA", nullptr);
  add_extension(ca.get(), ca.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_extension(ca.get(), ca.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(ca.get(), ca.get(), NID_subject_key_identifier, "hash");
  std::string permitted = "critical";
  for (const auto& name : names) permitted += ",permitted;DNS:" + name;
  add_extension(ca.get(), ca.get(), NID_name_constraints, permitted);
  if (!X509_sign(ca.get(), ca_key.get(), EVP_sha256())) fail("sign the CA");
  ca_pem_ = pem_of(ca.get());

  const Key leaf_key = new_key();  // one key for the leaves: they live and die together
  for (const auto& name : names) {
    if (servers_.contains(name)) continue;
    const Certificate leaf = new_certificate(leaf_key.get(), name, ca.get());
    add_extension(leaf.get(), ca.get(), NID_basic_constraints, "critical,CA:FALSE");
    add_extension(leaf.get(), ca.get(), NID_key_usage, "critical,digitalSignature");
    add_extension(leaf.get(), ca.get(), NID_ext_key_usage, "serverAuth");
    add_extension(leaf.get(), ca.get(), NID_subject_alt_name, "DNS:" + name);
    add_extension(leaf.get(), ca.get(), NID_authority_key_identifier, "keyid:always");
    if (!X509_sign(leaf.get(), ca_key.get(), EVP_sha256())) fail("sign " + name);
    SslContext context(SSL_CTX_new(TLS_server_method()));
    if (!context || !SSL_CTX_set_min_proto_version(context.get(), TLS1_2_VERSION) ||
        SSL_CTX_use_certificate(context.get(), leaf.get()) != 1 ||
        SSL_CTX_use_PrivateKey(context.get(), leaf_key.get()) != 1)
      fail("server context for " + name);
    SSL_CTX_set_alpn_select_cb(context.get(), select_http1, nullptr);
    SSL_CTX_set_mode(context.get(),
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    servers_.emplace(name, std::move(context));
  }
}

TlsAuthority::~TlsAuthority() = default;

SSL_CTX* TlsAuthority::server_context(const std::string& name) const {
  const auto found = servers_.find(name);
  return found == servers_.end() ? nullptr : found->second.get();
}

}  // namespace rlm::egress
