import os
import pathlib
import tempfile
import unittest

from skill import run


class FindNotesTest(unittest.TestCase):
    def test_finds_matching_lines_in_path_order(self) -> None:
        with tempfile.TemporaryDirectory() as root:
            notes = pathlib.Path(root, "notes")
            notes.mkdir()
            (notes / "b.md").write_text("# B\n\nKavi runs pipelines.\n")
            (notes / "a.md").write_text("# A\n\nnothing here\nkavi again\n")
            (notes / "c.txt").write_text("kavi, but not markdown\n")
            cwd = os.getcwd()
            os.chdir(root)
            try:
                found = run({"query": "KAVI"})
            finally:
                os.chdir(cwd)
            self.assertEqual(
                found["results"],
                [
                    {"path": "notes/a.md", "line": 4, "text": "kavi again"},
                    {"path": "notes/b.md", "line": 3, "text": "Kavi runs pipelines."},
                ],
            )

    def test_a_folder_outside_the_workspace_is_refused(self) -> None:
        for folder in ["/etc", "../notes"]:
            with self.assertRaises(ValueError):
                run({"query": "x", "folder": folder})


if __name__ == "__main__":
    unittest.main()
