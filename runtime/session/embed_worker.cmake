# cmake -DPARTS=worker/python/parts.txt -DSCRIPT=rlm_worker.py -DOUTPUT=worker_source.cpp
#       -P embed_worker.cmake
# Concatenates the Python worker's parts, in the order parts.txt lists them (two blank lines
# between two), into one script: written to SCRIPT (what tests/python_worker runs) and embedded
# in OUTPUT.
get_filename_component(parts_dir "${PARTS}" DIRECTORY)
file(STRINGS "${PARTS}" parts REGEX "^[^#]")
set(source "")
set(separator "")
foreach(part IN LISTS parts)
  file(READ "${parts_dir}/${part}" text)
  string(APPEND source "${separator}${text}")
  set(separator "\n\n")
endforeach()
string(FIND "${source}" ")rlm_worker\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${PARTS}: a part contains the raw-string delimiter )rlm_worker\"")
endif()
file(WRITE "${SCRIPT}.tmp" "${source}")
file(COPY_FILE "${SCRIPT}.tmp" "${SCRIPT}" ONLY_IF_DIFFERENT)
file(REMOVE "${SCRIPT}.tmp")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from worker/python/ (parts.txt) by runtime/session/embed_worker.cmake.\n"
  "#include \"session/worker_source.hpp\"\n\n"
  "namespace rlm::session {\n\n"
  "std::string_view worker_source() {\n"
  "  static constexpr char kSource[] = R\"rlm_worker(${source})rlm_worker\";\n"
  "  return {kSource, sizeof kSource - 1};\n"
  "}\n\n"
  "}  // namespace rlm::session\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
