import unittest

from kvparse import parse


class BasicTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(parse("host=db1; port=5432"), {"host": "db1", "port": "5432"})

    def test_whitespace(self):
        self.assertEqual(parse("  a =  1 ;b=2  ;   c= three words "), {"a": "1", "b": "2", "c": "three words"})

    def test_empty_input(self):
        self.assertEqual(parse(""), {})
        self.assertEqual(parse("  ;  ; "), {})

    def test_trailing_separator(self):
        self.assertEqual(parse("k=v;"), {"k": "v"})

    def test_empty_value(self):
        self.assertEqual(parse("k=; j = "), {"k": "", "j": ""})

    def test_value_with_equals(self):
        self.assertEqual(parse("expr=a=b=c; x=1"), {"expr": "a=b=c", "x": "1"})

    def test_last_wins(self):
        self.assertEqual(parse("a=1; a=2"), {"a": "2"})

    def test_missing_equals(self):
        with self.assertRaises(ValueError):
            parse("a=1; oops; b=2")

    def test_empty_key(self):
        with self.assertRaises(ValueError):
            parse("=value")
        with self.assertRaises(ValueError):
            parse("a=1;  = 2")


class EscapeTest(unittest.TestCase):
    def test_escaped_semicolon(self):
        self.assertEqual(parse(r"label=a\;b; size=3"), {"label": "a;b", "size": "3"})

    def test_escaped_semicolon_at_end(self):
        self.assertEqual(parse(r"k=a\;"), {"k": "a;"})

    def test_escaped_backslash_at_end(self):
        self.assertEqual(parse(r"dir=C:\\"), {"dir": "C:\\"})

    def test_escaped_backslash_then_separator(self):
        self.assertEqual(parse(r"a=x\\; b=2"), {"a": "x\\", "b": "2"})

    def test_escaped_equals_in_key(self):
        self.assertEqual(parse(r"a\=b=c"), {"a=b": "c"})

    def test_escaped_equals_in_value(self):
        self.assertEqual(parse(r"k=1\=2"), {"k": "1=2"})

    def test_many_escapes(self):
        self.assertEqual(
            parse(r"sql=SELECT 1\; SELECT 2; path=\\\\srv\\share; eq=\=\=; z=end"),
            {"sql": "SELECT 1; SELECT 2", "path": "\\\\srv\\share", "eq": "==", "z": "end"},
        )

    def test_escaped_ordinary_char(self):
        self.assertEqual(parse(r"k=\a\b"), {"k": "ab"})

    def test_lone_trailing_backslash(self):
        self.assertEqual(parse("k=abc\\"), {"k": "abc\\"})

    def test_escaped_semicolon_without_equals_is_one_pair(self):
        with self.assertRaises(ValueError):
            parse(r"a\;b")


if __name__ == "__main__":
    unittest.main()
