// A static helper the child setup tests run inside the sandbox, for checks a shell cannot make.
//   child_setup_probe bind ADDRESS PORT   bind a TCP socket; "ok" or "errno N"
//   child_setup_probe loopback            listen on 127.0.0.1, connect, exchange a byte; "ok"
//   child_setup_probe securebits          the securebits, in decimal
// Exit status 0 when the check succeeded.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int report_errno(const char* what) {
  std::printf("errno %d (%s: %s)\n", errno, what, std::strerror(errno));
  return 1;
}

int bind_port(const char* address, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return report_errno("socket");
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_port = htons(static_cast<std::uint16_t>(port));
  if (inet_pton(AF_INET, address, &where.sin_addr) != 1) return report_errno("inet_pton");
  if (bind(fd, reinterpret_cast<sockaddr*>(&where), sizeof where) != 0) return report_errno("bind");
  std::printf("ok\n");
  return 0;
}

int loopback() {
  const int server = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof where;
  if (bind(server, reinterpret_cast<sockaddr*>(&where), sizeof where) != 0)
    return report_errno("bind");
  if (listen(server, 1) != 0) return report_errno("listen");
  if (getsockname(server, reinterpret_cast<sockaddr*>(&where), &length) != 0)
    return report_errno("getsockname");
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(client, reinterpret_cast<sockaddr*>(&where), sizeof where) != 0)
    return report_errno("connect");
  const int accepted = accept(server, nullptr, nullptr);
  if (accepted < 0) return report_errno("accept");
  char byte = 'x';
  if (write(client, &byte, 1) != 1) return report_errno("write");
  byte = 0;
  if (read(accepted, &byte, 1) != 1 || byte != 'x') return report_errno("read");
  std::printf("ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "bind") == 0) return bind_port(argv[2], std::atoi(argv[3]));
  if (argc == 2 && std::strcmp(argv[1], "loopback") == 0) return loopback();
  if (argc == 2 && std::strcmp(argv[1], "securebits") == 0) {
    std::printf("%d\n", prctl(PR_GET_SECUREBITS, 0, 0, 0, 0));
    return 0;
  }
  std::fprintf(stderr, "usage: child_setup_probe bind ADDRESS PORT | loopback | securebits\n");
  return 2;
}
