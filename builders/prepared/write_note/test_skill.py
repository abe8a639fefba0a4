import pathlib
import tempfile
import unittest

from skill import run, slug


class WriteNoteTest(unittest.TestCase):
    def test_writes_the_note_under_a_slug(self) -> None:
        with tempfile.TemporaryDirectory() as folder:
            result = run({"title": "Hello, World!", "body": "First note."}, notes_dir=folder)
            path = pathlib.Path(result["path"])
            self.assertEqual(path.name, "hello-world.md")
            self.assertEqual(path.read_text(), "# Hello, World!\n\nFirst note.\n")

    def test_slug_never_holds_path_characters(self) -> None:
        self.assertEqual(slug("../../etc/passwd"), "etc-passwd")

    def test_empty_title_is_refused(self) -> None:
        with tempfile.TemporaryDirectory() as folder:
            with self.assertRaises(ValueError):
                run({"title": "  ", "body": "x"}, notes_dir=folder)


if __name__ == "__main__":
    unittest.main()
