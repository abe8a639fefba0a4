import pathlib
import tempfile
import unittest

from skill import run, slug


class WriteNoteTest(unittest.TestCase):
    def test_writes_the_note_under_a_slug(self):
        with tempfile.TemporaryDirectory() as folder:
            result = run({"title": "Hello, World!", "body": "First note."}, notes_dir=folder)
            self.assertEqual(pathlib.Path(result["path"]).name, "hello-world.md")
            self.assertEqual(pathlib.Path(result["path"]).read_text(), "# Hello, World!\n\nFirst note.\n")

    def test_slug_never_holds_path_characters(self):
        self.assertEqual(slug("../../etc/passwd"), "etc-passwd")

    def test_empty_title_is_refused(self):
        with tempfile.TemporaryDirectory() as folder:
            with self.assertRaises(ValueError):
                run({"title": "  ", "body": "x"}, notes_dir=folder)


if __name__ == "__main__":
    unittest.main()
