#!/usr/bin/env python3
"""Tests of tools/check-layering.py on tiny fixture trees: python3 tools/test_check_layering.py"""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-layering.py")


class CheckLayering(unittest.TestCase):
    def tree(self, files):
        root = tempfile.mkdtemp(prefix="kvo-layering-")
        self.addCleanup(subprocess.run, ["rm", "-rf", root])
        for rel, text in files.items():
            path = os.path.join(root, "src", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        return root

    def check(self, root):
        p = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr

    def test_layered_folder_passes(self):
        root = self.tree({
            "a/top.c": "int kvo__mid(void);\nint kvo_top(void) { return kvo__mid(); }\n",
            "a/mid.c": "int kvo__leaf(void);\nint kvo__mid(void) { return kvo__leaf() + 1; }\n",
            "a/leaf.c": "int kvo__leaf(void) { return 1; }\n",
        })
        rc, out = self.check(root)
        self.assertEqual(rc, 0, out)
        self.assertIn("no cycle in 1 folders (3 files, 2 uses", out)

    def test_call_cycle_fails_with_path(self):
        root = self.tree({
            "a/one.c": "int kvo__two(void);\nint kvo__one(void) { return kvo__two(); }\n",
            "a/two.c": "int kvo__three(void);\nint kvo__two(void) { return kvo__three(); }\n",
            "a/three.c": "int kvo__one(void);\nint kvo__three(void) { return kvo__one(); }\n",
        })
        rc, out = self.check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("cycle in src/a/: one.c -> two.c (kvo__two) -> three.c (kvo__three) "
                      "-> one.c (kvo__one)", out)

    def test_include_of_owned_header_is_a_use(self):
        root = self.tree({
            "b/x.c": '#include "y.h"\nint kvo__x(void) { return 0; }\n',
            "b/y.h": "int kvo__y(void);\n",
            "b/y.c": "int kvo__x(void);\nint kvo__y(void) { return kvo__x(); }\n",
        })
        rc, out = self.check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn('x.c -> y.c (#include "y.h") -> x.c (kvo__x)', out)

    def test_header_owned_by_its_only_definer(self):
        # decl.h is named after no .c file, but only impl.c defines what it declares.
        root = self.tree({
            "b/user.c": '#include "decl.h"\nint kvo__user(void) { return 0; }\n',
            "b/decl.h": "int kvo__impl(void);\n",
            "b/impl.c": "int kvo__user(void);\nint kvo__impl(void) { return kvo__user(); }\n",
        })
        rc, out = self.check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn('user.c (kvo__user) -> impl.c (#include "decl.h")', out)

    def test_shared_header_statics_comments_and_strings_do_not_count(self):
        root = self.tree({
            "c/c_internal.h": "int kvo__p(void);\nint kvo__q(void);\n",
            # q.c names kvo__p only in a comment, a string and a static function's name space.
            "c/p.c": '#include "c_internal.h"\nint kvo__p(void) { return kvo__q(); }\n',
            "c/q.c": ('#include "c_internal.h"\n/* kvo__p() */\n'
                      'static int kvo__r(void) { return 2; }\n'
                      'int kvo__q(void) { const char *s = "kvo__p()"; (void)s; return kvo__r(); }\n'),
            "c/r.c": "static int kvo__r(void) { return 3; }\nint kvo__s(void) { return kvo__r(); }\n",
        })
        rc, out = self.check(root)
        self.assertEqual(rc, 0, out)

    def test_subfolder_is_its_own_unit(self):
        root = self.tree({
            "d/top.c": "int kvo__sub(void);\nint kvo__top(void) { return kvo__sub(); }\n",
            "d/sub/sub.c": "int kvo__top(void);\nint kvo__sub(void) { return kvo__top(); }\n",
        })
        rc, out = self.check(root)
        self.assertEqual(rc, 0, out)
        self.assertIn("no cycle in 2 folders", out)

    def test_function_pointer_table_is_a_use(self):
        root = self.tree({
            "e/ops.c": ("int kvo__impl_run(void);\n"
                        "static int (*const table[])(void) = { kvo__impl_run };\n"
                        "int kvo__ops_run(void) { return table[0](); }\n"),
            "e/impl.c": "int kvo__ops_run(void);\nint kvo__impl_run(void) { return kvo__ops_run(); }\n",
        })
        rc, out = self.check(root)
        self.assertEqual(rc, 1, out)

    def test_engine_folder_is_checked(self):
        root = self.tree({"a/leaf.c": "int kvo__leaf(void) { return 1; }\n"})
        for name, text in {"x.c": "int kvo__y(void);\nint kvo__x(void) { return kvo__y(); }\n",
                           "y.c": "int kvo__x(void);\nint kvo__y(void) { return kvo__x(); }\n"}.items():
            os.makedirs(os.path.join(root, "engine"), exist_ok=True)
            with open(os.path.join(root, "engine", name), "w") as f:
                f.write(text)
        rc, out = self.check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("cycle in engine/: x.c -> y.c (kvo__y) -> x.c (kvo__x)", out)

    def test_missing_src_is_a_usage_error(self):
        root = tempfile.mkdtemp(prefix="kvo-layering-")
        self.addCleanup(os.rmdir, root)
        rc, out = self.check(root)
        self.assertEqual(rc, 2, out)
        self.assertIn("no src/ folder", out)


if __name__ == "__main__":
    unittest.main()
