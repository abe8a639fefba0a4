import unittest

from skill import run


class WordCountTest(unittest.TestCase):
    def test_counts_words_lines_and_characters(self) -> None:
        self.assertEqual(
            run({"text": "one two\nthree"}), {"words": 3, "lines": 2, "characters": 13}
        )

    def test_empty_text(self) -> None:
        self.assertEqual(run({"text": ""}), {"words": 0, "lines": 0, "characters": 0})


if __name__ == "__main__":
    unittest.main()
