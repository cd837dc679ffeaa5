#!/usr/bin/env python3
"""docs/architecture.md's module graph is the build's.

runtime/CMakeLists.txt writes each module's declared dependencies (the links between the module
targets) to module_graph.txt; the page holds the same lines between its module-graph markers. Any
difference fails, with what to paste.

usage: module_graph_check.py MODULE_GRAPH_TXT ARCHITECTURE_MD
"""
import pathlib
import sys

BEGIN, END = "<!-- module-graph:begin -->", "<!-- module-graph:end -->"


def edges(lines):
    graph = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("```"):
            continue
        module, _, dependencies = line.partition(":")
        graph[module.strip()] = sorted(dependencies.split())
    return graph


def main():
    built = edges(pathlib.Path(sys.argv[1]).read_text().splitlines())
    page = pathlib.Path(sys.argv[2]).read_text()
    if BEGIN not in page or END not in page:
        sys.exit(f"{sys.argv[2]} has no {BEGIN} ... {END} block")
    documented = edges(page.split(BEGIN, 1)[1].split(END, 1)[0].splitlines())
    if built != documented:
        expected = "\n".join(f"{m}: {' '.join(d)}".rstrip() for m, d in built.items())
        sys.exit(f"docs/architecture.md's module graph differs from the build's; the build's is:\n"
                 f"{expected}\n\ndocumented: {documented}")
    print(f"the documented module graph is the build's ({len(built)} modules)")


if __name__ == "__main__":
    main()
