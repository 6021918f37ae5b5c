#!/usr/bin/env python3
"""The module graph of src/, as CMake declares it and as the code includes it.

Each folder src/<module> is one module. Its declared dependencies come from its
CMakeLists.txt files (subfolders' too; a target ferry_<module>_<part> is <module>'s):
`ferry_module(<name> ... DEPS ferry_a ferry_b)`, or, for a folder that builds
something else (the `ferry` executable in src/cli), the ferry_<module> targets it links; linking
`ferry` (libferry, every module whole) declares every module. Its used dependencies are the
`#include "<other>/..."` lines in its sources.

The rule (--check) is direct: a module that includes a header of another module declares that
module in its own DEPS. Reaching it through a third module does not count, because the third
module may drop the dependency at any time and the include would then break with no change to
the file that has it. A cycle, in the declared or the included graph, is also a violation.
Public headers ("ferry/...", include/ferry/) are the API of libferry and not counted.

One folder has a stricter rule: the CLI (src/cli) links only libferry's public API and the tools
library, so it includes only "ferry/", "cli/" and "tools/" headers; an include of any other
module's header (an internal of libferry) is a violation naming the file and line.

Modules on the transport seam (SEAM_MODULES) include of transport/ only its interface (the
Channel and the Ring) and the registry (SEAM_HEADERS): a net/ or shm/ header there is a
violation naming the file and line.

Usage: module_graph.py [--root DIR] [--mermaid] [--check]
  (no flag)  prints each module with what it declares and what it includes
  --mermaid  prints the declared graph as a mermaid block, for docs/architecture.md
  --check    prints each violation and exits 1 if there is one
"""

import argparse
import pathlib
import re
import sys

SOURCE_SUFFIXES = {".h", ".cc", ".cpp", ".inc"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"', re.MULTILINE)
MODULE_CALL_RE = re.compile(r"ferry_module\s*\(\s*([A-Za-z0-9_]+)(.*?)\)", re.DOTALL)
LINK_CALL_RE = re.compile(r"target_link_libraries\s*\((.*?)\)", re.DOTALL)


def strip_cmake_comments(text):
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def ferry_targets(words):
    """Module names of the ferry_<module> targets among `words`; 'ferry' means libferry."""
    return {w[len("ferry_"):] if w.startswith("ferry_") else w
            for w in words if w == "ferry" or w.startswith("ferry_")}


def declared_deps(cmake_file):
    """Module names one CMakeLists.txt declares: the DEPS of its ferry_module() call and the
    ferry_* targets its target_link_libraries() calls link ('ferry' is libferry)."""
    text = strip_cmake_comments(cmake_file.read_text())
    words = []
    call = MODULE_CALL_RE.search(text)
    if call:
        args = call.group(2).split()
        words += args[args.index("DEPS") + 1:] if "DEPS" in args else []
    for link in LINK_CALL_RE.finditer(text):
        words += link.group(1).split()[1:]  # the first word is the target being linked
    return ferry_targets(words) - {"deps"}  # ferry_deps: third-party libraries only


def included_modules(folder, modules):
    """{other module: first file that includes it} for the sources under `folder`."""
    used = {}
    for path in sorted(folder.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        for target in INCLUDE_RE.findall(path.read_text(errors="replace")):
            if target in modules and target != folder.name:
                used.setdefault(target, path)
    return used


# src/cli's only allowed include folders: libferry's public API, its own, the tools library.
CLI_INCLUDE_FOLDERS = {"ferry", "cli", "tools", "plan"}


def cli_internal_includes(root):
    """'src/cli/x.cc:12 includes base/y.h' for each include of an internal header in src/cli."""
    found = []
    cli = root / "src" / "cli"
    for path in sorted(cli.rglob("*")) if cli.is_dir() else []:
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if m and m.group(1) not in CLI_INCLUDE_FOLDERS:
                header = line.split('"')[1]
                found.append(f"{path.relative_to(root)}:{number} includes {header}")
    return found


# Modules that reach the transports only through the seam, and the headers that are the seam.
SEAM_MODULES = {"megatron", "rank_group", "sync"}
SEAM_HEADERS = {"transport/transport.h", "transport/ring.h", "transport/registry.h"}


def seam_bypasses(root):
    """'src/m/x.cc:12 includes transport/net/y.h' for each transport header past the seam that
    a module of SEAM_MODULES includes."""
    found = []
    for module in sorted(SEAM_MODULES):
        folder = root / "src" / module
        for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE_RE.match(line)
                header = line.split('"')[1] if m else ""
                if m and m.group(1) == "transport" and header not in SEAM_HEADERS:
                    found.append(f"{path.relative_to(root)}:{number} includes {header}")
    return found


def load(root):
    """{module: (declared set, included {module: file})} for every folder of root/src."""
    src = root / "src"
    folders = sorted(p for p in src.iterdir() if p.is_dir())
    names = {p.name for p in folders}
    # libferry is the folders built with ferry_module(); cli and tools link it, are not in it.
    in_libferry = {p.name for p in folders
                   if any("ferry_module(" in strip_cmake_comments(c.read_text())
                          for c in p.rglob("CMakeLists.txt"))}
    graph = {}
    for folder in folders:
        declared = set()
        # A module may build in subfolders (src/transport/shm/CMakeLists.txt): all count.
        for cmake in sorted(folder.rglob("CMakeLists.txt")):
            declared |= {owning_module(d, names) for d in declared_deps(cmake)}
        if "ferry" in declared:  # libferry holds every module built with ferry_module()
            declared = (declared - {"ferry"}) | in_libferry
        graph[folder.name] = (declared - {folder.name}, included_modules(folder, names))
    return graph


def owning_module(target, names):
    """The folder a ferry_<target> belongs to: its name, or the longest folder name that
    prefixes it ("transport_shm" is transport's); else the target itself, unresolved."""
    if target in names or target == "ferry":
        return target
    owners = [n for n in names if target.startswith(n + "_")]
    return max(owners, key=len) if owners else target


def find_cycles(edges):
    """Each cycle of the graph {node: set of nodes} once, as a list of nodes."""
    cycles, seen = [], set()
    state = {}  # node -> 1 while on the path, 2 when done

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    cycles.append(cycle + [nxt])
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return cycles


def violations(graph, root):
    found = []
    for module, (declared, used) in sorted(graph.items()):
        for dep in sorted(declared - set(graph)):
            found.append(f"{module}: declares ferry_{dep}, which is not a folder of src/")
        for dep, path in sorted(used.items()):
            if dep not in declared:
                found.append(f"{module}: includes {dep}/ ({path.relative_to(root)}) "
                             f"but its CMakeLists.txt does not declare ferry_{dep}")
    for kind, edges in (("declared", {m: d & set(graph) for m, (d, _) in graph.items()}),
                        ("included", {m: set(u) for m, (_, u) in graph.items()})):
        for cycle in find_cycles(edges):
            found.append(f"{kind} dependency cycle: {' -> '.join(cycle)}")
    for include in seam_bypasses(root):
        found.append(f"{include}, past the transport seam: use only "
                     f"{', '.join(sorted(SEAM_HEADERS))}")
    for include in cli_internal_includes(root):
        found.append(f"cli: {include}, an internal header; the CLI uses only libferry's public "
                     "API (ferry/) and the tools library (tools/)")
    return found


def print_text(graph):
    for module, (declared, used) in sorted(graph.items()):
        print(f"{module}")
        print(f"  declares: {' '.join(sorted(declared)) or '-'}")
        print(f"  includes: {' '.join(sorted(used)) or '-'}")


def print_mermaid(graph):
    # Only the edges a module needs beyond what its other dependencies already bring, so the
    # picture stays readable; the CMakeLists.txt files hold the full lists.
    def reach(module, seen=None):
        seen = set() if seen is None else seen
        for dep in graph.get(module, (set(), {}))[0]:
            if dep not in seen:
                seen.add(dep)
                reach(dep, seen)
        return seen

    print("```mermaid")
    print("graph TD")
    for module, (declared, _) in sorted(graph.items()):
        direct = {d for d in declared if d in graph}
        implied = set().union(*(reach(d) for d in direct)) if direct else set()
        for dep in sorted(direct - implied):
            print(f"  {module} --> {dep}")
    print("```")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent.parent,
                        help="the repository (default: this script's parent folder)")
    parser.add_argument("--mermaid", action="store_true", help="print a mermaid block")
    parser.add_argument("--check", action="store_true", help="exit 1 on a violation")
    args = parser.parse_args()
    root = args.root.resolve()
    if not (root / "src").is_dir():
        sys.exit(f"module_graph: {root} has no src/ folder (--root names the repository)")
    graph = load(root)
    if args.mermaid:
        print_mermaid(graph)
    elif not args.check:
        print_text(graph)
    if args.check:
        found = violations(graph, root)
        for v in found:
            print(f"module graph violation: {v}")
        if found:
            return 1
        print(f"module graph: {len(graph)} modules, no violations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
