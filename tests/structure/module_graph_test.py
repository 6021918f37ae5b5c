"""scripts/module_graph.py --check on small made-up trees: it passes a clean one and names
each undeclared include and each cycle in a broken one."""

import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "module_graph.py"


def make_tree(root, modules):
    """modules: {name: (cmake text, {file name: source text})}"""
    for name, (cmake, files) in modules.items():
        folder = root / "src" / name
        folder.mkdir(parents=True)
        (folder / "CMakeLists.txt").write_text(textwrap.dedent(cmake))
        for file_name, text in files.items():
            (folder / file_name).parent.mkdir(parents=True, exist_ok=True)
            (folder / file_name).write_text(textwrap.dedent(text))


def check(root):
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--root", str(root)],
                          capture_output=True, text=True)


class ModuleGraphCheck(unittest.TestCase):
    def test_clean_tree_passes(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            make_tree(root, {
                "base": ("ferry_module(base SOURCES a.cc)\n", {"a.h": '#include "ferry/x.h"\n'}),
                "wire": ("ferry_module(wire SOURCES m.cc DEPS ferry_base)\n",
                         {"m.cc": '#include "base/a.h"\n#include "wire/m.h"\n'}),
                "app": ("add_executable(app main.cc)\ntarget_link_libraries(app PRIVATE ferry)\n",
                        {"main.cc": '#include "wire/m.h"\n#include "base/a.h"\n'}),
            })
            result = check(root)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_a_seam_module_including_a_transport_past_the_seam_fails_naming_the_line(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            make_tree(root, {
                "transport": ("ferry_module(transport SOURCES r.cc)\n", {}),
                "megatron": ("ferry_module(megatron SOURCES s.cc DEPS ferry_transport)\n",
                             {"s.cc": '#include "transport/registry.h"\n'
                                      '#include "transport/transport.h"\n'
                                      '#include "transport/net/channel.h"\n'}),
            })
            result = check(root)
            self.assertEqual(result.returncode, 1)
            self.assertIn("src/megatron/s.cc:3 includes transport/net/channel.h, past the "
                          "transport seam", result.stdout)
            self.assertNotIn("includes transport/registry.h", result.stdout)
            self.assertNotIn("includes transport/transport.h", result.stdout)

    def test_undeclared_include_in_a_subfolder_fails_naming_the_file(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            make_tree(root, {
                "base": ("ferry_module(base SOURCES a.cc)\n", {}),
                "wire": ("ferry_module(wire SOURCES m.cc DEPS ferry_base)\n", {}),
                # transport reaches wire only through nothing: the include is undeclared.
                "transport": ("ferry_module(transport SOURCES net/c.cc\n  DEPS ferry_base)\n",
                              {"net/c.cc": '#include "wire/message.h"\n'}),
            })
            result = check(root)
            self.assertEqual(result.returncode, 1)
            self.assertIn("transport: includes wire/ (src/transport/net/c.cc)", result.stdout)
            self.assertIn("does not declare ferry_wire", result.stdout)

    def test_transitive_reach_is_not_a_declaration(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            make_tree(root, {
                "base": ("ferry_module(base SOURCES a.cc)\n", {}),
                "wire": ("ferry_module(wire SOURCES m.cc DEPS ferry_base)\n", {}),
                "sync": ("ferry_module(sync SOURCES s.cc DEPS ferry_wire)\n",
                         {"s.cc": '#include "base/a.h"\n'}),
            })
            result = check(root)
            self.assertEqual(result.returncode, 1)
            self.assertIn("sync: includes base/", result.stdout)

    def test_a_module_may_build_in_subfolders(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            make_tree(root, {
                "base": ("ferry_module(base SOURCES a.cc)\n", {}),
                "wire": ("ferry_module(wire SOURCES m.cc DEPS ferry_base)\n", {}),
                "transport": ("add_subdirectory(shm)\n", {
                    "shm/CMakeLists.txt": "ferry_module(transport_shm SOURCES r.cc DEPS ferry_wire)\n",
                    "shm/r.cc": '#include "wire/m.h"\n'}),
                "tools": ("ferry_module(tools SOURCES s.cc DEPS ferry_transport_shm)\n",
                          {"s.cc": '#include "transport/shm/r.h"\n'}),
            })
            result = check(root)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_cycle_fails(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            make_tree(root, {
                "a": ("ferry_module(a SOURCES a.cc DEPS ferry_b)\n", {"a.cc": '#include "b/b.h"\n'}),
                "b": ("ferry_module(b SOURCES b.cc DEPS ferry_a)\n", {"b.cc": '#include "a/a.h"\n'}),
            })
            result = check(root)
            self.assertEqual(result.returncode, 1)
            self.assertIn("declared dependency cycle: a -> b -> a", result.stdout)
            self.assertIn("included dependency cycle: a -> b -> a", result.stdout)

    def test_cli_including_an_internal_header_fails_naming_file_and_line(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            make_tree(root, {
                "base": ("ferry_module(base SOURCES a.cc)\n", {}),
                "tools": ("add_library(ferry_tools a.cc)\n"
                          "target_link_libraries(ferry_tools PUBLIC ferry ferry_base)\n",
                          {"t.h": '#include "base/a.h"\n'}),  # tools may use internals
                "cli": ("add_executable(ferry_cli main.cc)\n"
                        "target_link_libraries(ferry_cli PRIVATE ferry ferry_tools)\n",
                        {"main.cc": '#include "ferry/token.h"\n#include "cli/c.h"\n'
                                    '#include "tools/t.h"\n',
                         "cmd.cc": '#include "cli/c.h"\n\n#include "base/a.h"\n'}),
            })
            result = check(root)
            self.assertEqual(result.returncode, 1)
            self.assertIn("cli: src/cli/cmd.cc:3 includes base/a.h", result.stdout)
            self.assertNotIn("main.cc", result.stdout)
            self.assertNotIn("tools/t.h", result.stdout)

    def test_sync_rank_group_and_megatron_are_each_held_to_the_seam(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            tree = {"transport": ("ferry_module(transport SOURCES transport.cc)\n", {})}
            for module in ("sync", "rank_group", "megatron"):
                tree[module] = (f"ferry_module({module} SOURCES g.cc DEPS ferry_transport)\n",
                                {"g.cc": '#include "transport/ring.h"\n'
                                         '#include "transport/shm/memfd_ring.h"\n'})
            make_tree(root, tree)
            result = check(root)
            self.assertEqual(result.returncode, 1)
            for module in ("sync", "rank_group", "megatron"):
                self.assertIn(f"src/{module}/g.cc:2 includes transport/shm/memfd_ring.h",
                              result.stdout)
            self.assertNotIn("includes transport/ring.h", result.stdout)

    def test_unknown_dependency_fails(self):
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            make_tree(root, {"base": ("ferry_module(base SOURCES a.cc DEPS ferry_nosuch)\n", {})})
            result = check(root)
            self.assertEqual(result.returncode, 1)
            self.assertIn("base: declares ferry_nosuch, which is not a folder of src/", result.stdout)


if __name__ == "__main__":
    unittest.main()
