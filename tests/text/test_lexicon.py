"""Pronunciation lexicons: whole-word and case rules, validation of entries, phoneme entries, order with
normalisation, and the phoneme tokenizer reading inline phoneme spans."""

from __future__ import annotations

import json

import pytest

from cadenza.errors import InputError
from cadenza.text import normalize
from cadenza.text.lexicon import MAX_ENTRIES, MAX_LEXICON_BYTES, Lexicon, LexiconEntry, phoneme_span
from cadenza.text.phonemes import PhonemeTable, PhonemeTokenizer, phonemize


def lex(*entries: dict) -> Lexicon:
    return Lexicon.from_json({"entries": list(entries)})


def test_whole_words_only():
    lexicon = lex({"word": "Cadenza", "respelling": "ka den za"})
    text = "Cadenza, cadenza's CADENZA; Cadenzas and MyCadenza and cadenza_x and 2Cadenza."
    assert lexicon.apply(text) == ("ka den za, ka den za's ka den za; Cadenzas and MyCadenza and cadenza_x and "
                                   "2Cadenza.")


def test_case_rules():
    lexicon = lex({"word": "US", "respelling": "you ess", "case_sensitive": True},
                  {"word": "us", "respelling": "uhs"})
    # The case-sensitive entry wins where the case matches; the insensitive one takes every other case.
    assert lexicon.apply("US and us and Us") == "you ess and uhs and uhs"
    only_sensitive = lex({"word": "US", "respelling": "you ess", "case_sensitive": True})
    assert only_sensitive.apply("US us Us") == "you ess us Us"


def test_longest_entry_wins_and_spaces_match_any_run():
    lexicon = lex({"word": "New", "respelling": "noo"}, {"word": "New York", "respelling": "noo york city"})
    assert lexicon.apply("New  York is New.") == "noo york city is noo."


def test_one_pass_replacements_are_not_matched_again():
    lexicon = lex({"word": "a", "respelling": "b"}, {"word": "b", "respelling": "c"})
    assert lexicon.apply("a b") == "b c"


def test_protected_tags_and_descriptions_are_not_looked_into():
    lexicon = lex({"word": "laughter", "respelling": "LAFF"}, {"word": "strong", "respelling": "STRONG"},
                  {"word": "warm", "respelling": "WARM"})
    assert lexicon.apply("(a warm voice)[laughter] <strong>strong</strong> laughter") == \
        "(a warm voice)[laughter] <strong>STRONG</strong> LAFF"


def test_han_entries_match_inside_chinese_text():
    lexicon = lex({"word": "重庆", "respelling": "崇庆"})
    assert lexicon.apply("我去重庆玩") == "我去崇庆玩"


def test_applied_before_normalization():
    lexicon = lex({"word": "5K", "respelling": "five kilometer run"})
    assert normalize("I ran a 5K.") == "I ran a five K."
    assert normalize(lexicon.apply("I ran a 5K.")) == "I ran a five kilometer run."


@pytest.mark.parametrize("entry, message", [
    ({"word": "x"}, "exactly one of"),
    ({"word": "x", "respelling": "y", "phonemes": "z"}, "exactly one of"),
    ({"word": "", "respelling": "y"}, "word is empty"),
    ({"word": "<strong>", "respelling": "y"}, "markup"),
    ({"word": "x", "respelling": "[laughter]"}, "markup"),
    ({"word": "x", "respelling": "a\x07b"}, "control"),
    ({"word": "...", "respelling": "dots"}, "no letter or digit"),
    ({"word": "x", "respelling": "!!"}, "no letter or digit to speak"),
    ({"word": "x" * 101, "respelling": "y"}, "at most 100"),
    ({"word": "x", "phonemes": "h@loU1"}, "must be IPA"),
    ({"word": "x", "respelling": "y", "case_sensitive": "yes"}, "true or false"),
    ({"word": "x", "respelling": "y", "lang": "en"}, "unknown field"),
    ({"word": 5, "respelling": "y"}, "must be a string"),
])
def test_invalid_entries_are_named(entry, message):
    with pytest.raises(InputError, match=message) as info:
        Lexicon.from_json({"entries": [{"word": "ok", "respelling": "fine"}, entry]})
    assert "entry 1" in str(info.value)


def test_duplicates_sizes_and_files(tmp_path):
    with pytest.raises(InputError, match="entries 0 and 1 are both for 'Word'"):
        lex({"word": "Word", "respelling": "a"}, {"word": "word", "respelling": "b"})
    lex({"word": "Word", "respelling": "a", "case_sensitive": True}, {"word": "word", "respelling": "b"})  # fine
    with pytest.raises(InputError, match=f"at most {MAX_ENTRIES} entries"):
        Lexicon.from_json([{"word": f"w{i}", "respelling": "x"} for i in range(MAX_ENTRIES + 1)])
    with pytest.raises(InputError, match="not valid JSON"):
        Lexicon.from_text("{nope")
    with pytest.raises(InputError, match="not valid JSON"):
        Lexicon.from_text("[" * 100_000)  # nesting too deep for the parser: an error, not a crash
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_LEXICON_BYTES + 1))
    with pytest.raises(InputError, match=f"at most {MAX_LEXICON_BYTES}"):
        Lexicon.from_file(big)
    good = tmp_path / "lex.json"
    good.write_text(json.dumps([{"word": "GIF", "respelling": "jif", "case_sensitive": True}]))
    assert Lexicon.from_file(good).to_json() == {"entries": [{"word": "GIF", "respelling": "jif",
                                                              "case_sensitive": True}]}
    with pytest.raises(InputError, match="cannot read the lexicon file"):
        Lexicon.from_file(tmp_path / "missing.json")


def test_request_entries_override_the_voice_entries():
    voice = lex({"word": "tomato", "respelling": "tomahto"}, {"word": "GIF", "respelling": "gif"})
    request = lex({"word": "gif", "respelling": "jif"})
    assert request.over(voice).apply("GIF tomato") == "jif tomahto"


TABLE = PhonemeTable(symbols=tuple(" ,.!?'" + "abdefhijklmnoprstuvwzæðŋɐɑɔəɚɛɜɪɹɾʃʊʌʒʔθˈˌː"))


def test_phoneme_entries():
    lexicon = lex({"word": "Cadenza", "phonemes": "kədˈɛnzə"})
    with pytest.raises(InputError, match="'Cadenza' gives phonemes, but this model reads text"):
        lexicon.apply("Hello Cadenza.")
    assert lexicon.apply("no match here") == "no match here"  # only a matching phoneme entry is an error
    assert lexicon.apply("Hello Cadenza.", TABLE.symbols) == f"Hello {phoneme_span('kədˈɛnzə')}."
    with pytest.raises(InputError, match="phoneme symbol 'ʁ'"):
        lex({"word": "rue", "phonemes": "ʁy"}).apply("rue", TABLE.symbols)
    assert LexiconEntry("x", phonemes="e\u0303").phonemes == "e\u0303"  # kept as NFD code points


def test_the_phoneme_tokenizer_reads_spans_symbol_for_symbol():
    tokenizer = PhonemeTokenizer(TABLE)
    text = normalize(lex({"word": "Cadenza", "phonemes": "kədˈɛnzə"}).apply("Hello Cadenza. I am 3.", TABLE.symbols))
    assert text == f"Hello {phoneme_span('kədˈɛnzə')}. I am three."
    hello, rest = phonemize("Hello"), phonemize("I am three.")
    expected = [*hello, " ", *"kədˈɛnzə", ".", " ", *rest]
    assert tokenizer.symbols(text) == [s for s in expected if s in tokenizer.index]
    assert tokenizer.encode(text) == [tokenizer.index[s] for s in expected if s in tokenizer.index]


def test_indexed_matching_equals_one_regex_alternation():
    """The lexicon looks candidates up instead of trying every entry at every place; on random text it must
    replace exactly what the plain alternation of all entries (longest, then case-sensitive first) replaces."""
    import random
    import re

    from cadenza.text.lexicon import _pattern

    rng = random.Random(7)
    pool = ["new", "york", "us", "sql", "a", "b2", "x_y", "重庆", "庆", "c++", "e.g.", "don't", "ny"]
    entries, seen = [], set()
    for _ in range(40):
        word = " ".join(rng.choice(pool) for _ in range(rng.randint(1, 2)))
        word = "".join(c.upper() if rng.random() < 0.3 else c for c in word)
        entry = LexiconEntry(word, respelling=f"R{len(entries)}", case_sensitive=rng.random() < 0.4)
        if entry.key not in seen:
            seen.add(entry.key)
            entries.append(entry)
    lexicon = Lexicon(entries)
    order = sorted(range(len(entries)), key=lambda i: (-len(entries[i].word), not entries[i].case_sensitive))
    alternation = re.compile("|".join(f"(?P<e{i}>{_pattern(entries[i])})" for i in order))
    for _ in range(200):
        text = " ".join(rng.choice(pool + ["NEW", "Us", "SQL", "我去重庆", "x", "Cx", "__"])
                        for _ in range(rng.randint(1, 12)))
        expected = alternation.sub(lambda m: entries[int(m.lastgroup[1:])].respelling, text)
        assert lexicon.apply(text) == expected, text


def test_a_parsed_lexicon_is_bounded_as_a_file_is_and_json_text_is_the_json():
    """1,000 entries of long words fit the entry limits but not 256 KiB of JSON: a request's lexicon (parsed by the
    server's JSON body) was accepted at 311 KB while the same entries were refused as a file or a saved voice's."""
    from cadenza.api.markup import as_lexicon

    big = [{"word": f"w{i:03d}" + "x" * 90, "respelling": "y" * 200} for i in range(MAX_ENTRIES)]
    assert len(json.dumps(big)) > MAX_LEXICON_BYTES
    with pytest.raises(InputError, match="bytes as JSON; at most"):
        Lexicon.from_json(big)
    text = json.dumps({"entries": [{"word": "SQL", "respelling": "sequel"}]})
    assert as_lexicon(text).to_json() == as_lexicon(json.loads(text)).to_json()  # a JSON string, not a file name
