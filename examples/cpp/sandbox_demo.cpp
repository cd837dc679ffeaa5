// Embedding librlm_sandbox: one sandboxed command and one sandboxed Python cell.
//   sandbox_demo [COMMAND ARGS...]     (default: /bin/true)
// Built against an installed rlm-sandbox by CMakeLists.txt (find_package) or Makefile (pkg-config).
#include <chrono>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/session.hpp"

int main(int argc, char** argv) {
  try {
    // A command under the shipped "default" policy: isolated, and the run fails closed when this
    // host cannot isolate it.
    const rlm::Policy policy = rlm::load_policy("default");
    auto backend = rlm::select_backend(policy);
    rlm::Request request;
    request.argv = argc > 1 ? std::vector<std::string>(argv + 1, argv + argc)
                            : std::vector<std::string>{"/bin/true"};
    const rlm::Result result = backend->run(request, policy);
    std::cout << "run: " << result.to_json().dump() << "\n";
    if (result.status != rlm::Status::ok) return 1;

    // A persistent Python REPL in its own sandbox: variables live across cells.
    const rlm::Policy repl_policy = rlm::load_policy("python-repl");
    auto repl_backend = rlm::select_backend(repl_policy);
    auto session = repl_backend->open_session(repl_policy, rlm::SessionOptions{});
    session->execute("x = 6 * 7", std::chrono::seconds(30));
    const rlm::CellResult cell = session->execute("print(x)", std::chrono::seconds(30));
    std::cout << "cell: " << rlm::to_string(cell.status) << " " << cell.stdout_data;
    session->close();
    return cell.status == rlm::CellStatus::ok && cell.stdout_data == "42\n" ? 0 : 1;
  } catch (const std::exception& error) {
    std::cerr << "sandbox_demo: " << error.what() << "\n";
    return 125;
  }
}
