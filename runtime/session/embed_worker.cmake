# cmake -DINPUT=rlm_worker.py -DOUTPUT=worker_source.cpp -P embed_worker.cmake
file(READ "${INPUT}" source)
string(FIND "${source}" ")rlm_worker\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )rlm_worker\"")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from worker/python/rlm_worker.py by runtime/session/embed_worker.cmake.\n"
  "#include \"session/worker_source.hpp\"\n\n"
  "namespace rlm::session {\n\n"
  "std::string_view worker_source() {\n"
  "  static constexpr char kSource[] = R\"rlm_worker(${source})rlm_worker\";\n"
  "  return {kSource, sizeof kSource - 1};\n"
  "}\n\n"
  "}  // namespace rlm::session\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
