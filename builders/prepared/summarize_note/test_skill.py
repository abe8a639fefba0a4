import os
import pathlib
import tempfile
import unittest

from skill import run


class SummarizeNoteTest(unittest.TestCase):
    def test_title_words_and_lines(self) -> None:
        with tempfile.TemporaryDirectory() as root:
            pathlib.Path(root, "n.md").write_text("# Hello, kavi\n\nTwo words.\n")
            cwd = os.getcwd()
            os.chdir(root)
            try:
                summary = run({"path": "n.md"})
            finally:
                os.chdir(cwd)
            self.assertEqual(
                summary, {"path": "n.md", "title": "Hello, kavi", "words": 5, "lines": 3}
            )

    def test_a_path_outside_the_workspace_is_refused(self) -> None:
        for path in ["/etc/passwd", "../x.md"]:
            with self.assertRaises(ValueError):
                run({"path": path})


if __name__ == "__main__":
    unittest.main()
