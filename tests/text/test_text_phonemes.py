"""The phoneme text frontend (models whose LM reads espeak-ng phonemes, e.g. cadenza-tiny v2): text -> IPA symbols,
the folder's ``phonemes.json`` table, streaming pieces a word at a time, and the frontend's choice of tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from cadenza.errors import CheckpointError, TextError
from cadenza.text.lexicon import Lexicon, LexiconEntry
from cadenza.text.phonemes import (
    PHONEMES_FILE,
    PhonemeTable,
    PhonemeTokenizer,
    drop_emoji,
    phonemize,
    spell_initials,
    spell_inner_marks,
)

SYMBOLS = ("_", "^", "$", " ", ",", ".", "?", "!", ";", ":", "ˈ", "ˌ", "ː", "a", "b", "d", "e", "f", "h", "i", "j",
           "k", "l", "m", "n", "o", "p", "s", "t", "u", "v", "w", "z", "æ", "ð", "ŋ", "ɑ", "ɔ", "ə", "ɚ", "ɛ", "ɜ",
           "ɡ", "ɪ", "ɹ", "ɾ", "ʃ", "ʊ", "ʌ", "ʒ", "θ", "ᵻ", "r", "c", "ç", "x", "ʔ", "ɐ", "ɒ", "ɬ", "ʲ")


def test_phonemize_keeps_words_stress_and_clause_punctuation():
    out = phonemize("Hello there, friend.")
    text = "".join(out)
    assert text.startswith("həlˈoʊ ðˈɛɹ,") and text.endswith(".")
    assert out.count(" ") == 2 and "ˈ" in out
    assert all(len(s) == 1 for s in out)  # one code point per symbol (NFD), as Piper
    assert phonemize("") == [] and phonemize("   ") == []
    # Clause punctuation becomes a symbol even when espeak would fold it into the clause.
    assert "".join(phonemize("Yes; no? Maybe!")).count(";") == 1


def test_phonemize_is_deterministic_and_thread_safe():
    from concurrent.futures import ThreadPoolExecutor

    sentences = ["The kettle takes a few minutes to boil.", "Could you call me later?"] * 8
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(phonemize, sentences))
    assert results[0::2] == [results[0]] * 8 and results[1::2] == [results[1]] * 8


def test_table_round_trip_and_validation(tmp_path):
    table = PhonemeTable(symbols=SYMBOLS)
    table.write(tmp_path / PHONEMES_FILE)
    assert PhonemeTable.read(tmp_path / PHONEMES_FILE) == table
    with pytest.raises(CheckpointError, match="without repeats"):
        PhonemeTable(symbols=("a", "a"))
    with pytest.raises(CheckpointError, match="unknown phoneme backend"):
        PhonemeTable(symbols=("a",), backend="festival")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CheckpointError, match="cannot read the phoneme table"):
        PhonemeTable.read(tmp_path / "bad.json")



def test_the_tables_own_lexicon_is_read_written_and_applied(tmp_path):
    """A model's pronunciations for words espeak-ng says wrong (cadenza-tiny: "Cadenza", which espeak-ng stresses on
    its first syllable): applied to every text its tokenizer reads, streamed or not, whole words in any case; a
    request's or a saved voice's lexicon, applied to the text before, wins."""
    from cadenza.text.lexicon import Lexicon

    lexicon = Lexicon.from_json([{"word": "Cadenza", "phonemes": "kədˈɛnzɑː"}])
    table = PhonemeTable(symbols=SYMBOLS, lexicon=lexicon)
    table.write(tmp_path / PHONEMES_FILE)
    assert PhonemeTable.read(tmp_path / PHONEMES_FILE) == table
    tok = PhonemeTokenizer.from_dir(tmp_path)
    plain = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    assert "".join(plain.symbols("This is Cadenza.")) != "ðɪs ɪz kədˈɛnzɑː."  # espeak-ng's own reading differs
    assert "".join(tok.symbols("This is Cadenza.")) == "ðɪs ɪz kədˈɛnzɑː."
    assert "".join(tok.symbols("CADENZA and cadenza")) == "kədˈɛnzɑː ænd kədˈɛnzɑː"
    assert tok.symbols("Cadenzas") == plain.symbols("Cadenzas")  # whole words only
    stream = tok.stream_encoder()
    streamed = [i for p in ["This is Cad", "enza, and", " more."] for i in stream.feed(p)] + stream.flush()
    space = tok.index[" "]
    assert [i for i in streamed if i != space] == [i for i in tok.encode("This is Cadenza, and more.") if i != space]
    request = Lexicon.from_json([{"word": "cadenza", "phonemes": "kˈædənz"}])
    assert "".join(tok.symbols(request.apply("This is Cadenza.", SYMBOLS))) == "ðɪs ɪz kˈædənz."
    # Entries the model cannot say, or that are not entries, fail the load by name.
    with pytest.raises(CheckpointError, match="lexicon entry 'Cadenza'.*'ʔ'|'ʔ'.*Cadenza"):
        PhonemeTable(symbols=tuple(s for s in SYMBOLS if s != "ʔ"),
                     lexicon=Lexicon.from_json([{"word": "Cadenza", "phonemes": "kəʔ"}]))
    for bad in ([{"word": "Cadenza"}], {"words": []}, "Cadenza"):
        (tmp_path / "bad.json").write_text(json.dumps({"symbols": list(SYMBOLS), "lexicon": bad}))
        with pytest.raises(CheckpointError, match="cannot read the phoneme table.*lexicon"):
            PhonemeTable.read(tmp_path / "bad.json")


@pytest.mark.parametrize(("text", "said"), [
    ("<|ph:kədˈɛnzɑː|>'s engine", "kədˈɛnzɑːz ˈɛndʒɪn"), ("<|ph:kədˈɛnzɑː|>\u2019s.", "kədˈɛnzɑːz."),
    ("<|ph:kˈɜːt|>'s car", "kˈɜːts kˈɑːɹ"), ("<|ph:ˈɛndʒɪnˌɛks|>'s logs", "ˈɛndʒɪnˌɛksɪz lˈɔɡz")])
def test_a_possessive_after_phonemes_is_said_as_english_says_it(text, said):
    """espeak-ng reads an "'s" left alone after a phoneme span as the letter S ("Cadenza-ess")."""
    assert "".join(PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS)).symbols(text)) == said

def test_tokenizer_encodes_known_symbols_and_streams_whole_words():
    tok = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    text = "Please call me tomorrow, at half past seven."
    ids = tok.encode(text)
    assert ids and all(0 <= i < len(SYMBOLS) for i in ids)
    assert [SYMBOLS[i] for i in ids] == [s for s in phonemize(text) if s in tok.index]
    # Pieces as an upstream LLM streams them: words are held back until complete, so the ids are the whole text's
    # (a word split as "tomor" + "row" is phonemised once, whole).
    stream = tok.stream_encoder()
    pieces = ["Ple", "ase call", " me tomor", "row, at", " half past", " sev", "en."]
    streamed = [i for p in pieces for i in stream.feed(p)] + stream.flush()
    space = tok.index[" "]
    assert [i for i in streamed if i != space] == [i for i in ids if i != space]
    assert stream.feed("") == [] and stream.flush() == []


def test_pieces_are_counted_as_encode_reads_them_and_encodings_are_not_shared():
    """``count_piece`` reads a piece without its leading space (one espeak-ng run shared with the segment's own
    ids through the cache) and counts the word space apart: the same as encoding the piece as written. The cache
    hands out copies."""
    tok = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    for piece in [" at half past seven.", "  , then home", " <|ph:hɛ|> there", " Dr. Smith's car", " 3.14 m."]:
        assert tok.count_piece(piece) == len(tok.encode(piece)) + 1
        assert tok.encode(piece) == tok.encode(piece.lstrip())
    ids = tok.encode("Please call me.")
    ids.append(-1)
    assert tok.encode("Please call me.")[-1] != -1


@pytest.mark.parametrize(("text", "spelled"), [
    ("the U.S.A. border", "the USA border"), ("we met in the U.S.", "we met in the US."),
    ("in the U.S.!", "in the US!"), ("J. K. Rowling wrote it.", "J K Rowling wrote it."),
    ("a.k.a. the boss", "AKA the boss"), ("I like vitamin C.", "I like vitamin C."), ("3.14 m.", "3.14 m.")])
def test_initialisms_lose_their_inner_full_stops(text, spelled):
    assert spell_initials(text) == spelled


def test_marks_inside_a_word_are_read_out():
    assert spell_inner_marks("Mail bob@example.com or https://x.org/a?b now.") == (
        "Mail bob@example dot com or https colon //x dot org/a question mark b now.")
    assert spell_inner_marks("Yes. No? Fine: go!") == "Yes. No? Fine: go!"  # marks between words stay marks


@pytest.mark.parametrize(("text", "script"), [("你好，世界。", "CJK"), ("I love 東京 a lot.", "CJK"),
                                             ("Привет!", "CYRILLIC"), ("こんにちは", "HIRAGANA"), ("مرحبا", "ARABIC")])
def test_an_english_phoneme_model_refuses_other_scripts_by_name(text, script):
    """espeak-ng's English voice reads them as their script's name ("Chinese letter Chinese letter")."""
    tok = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    with pytest.raises(TextError, match=f"Latin letters.*{script}"):
        tok.encode(text)
    assert tok.encode("Zoë and José met at café α.")  # accented Latin, and Greek letters (read by their names)
    assert tok.encode("Say <|ph:kədˈɛnzə|> now.")  # IPA spans are symbols, not text


def test_check_script_refuses_what_encode_refuses_without_reading_the_text():
    """A book's later paragraphs are checked before its first audio (api/request_batches.check_scripts): the check
    agrees with ``encode``, so what the model's lexicon respells and phoneme spans pass, and it runs no espeak-ng."""
    plain = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    for text in ("I love 東京 a lot.", "Привет!", "x" * 50_000 + " 你"):
        with pytest.raises(TextError, match="another script"):
            plain.check_script(text)
    plain.check_script("Zoë and José met at café α, then " + "ordinary words " * 10_000)
    plain.check_script("Say <|ph:kədˈɛnzə|> now.")
    respelled = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS, lexicon=Lexicon([LexiconEntry("東京", "Tokyo")])))
    respelled.check_script("I love 東京 a lot.")
    assert respelled.encode("I love 東京 a lot.") == respelled.encode("I love Tokyo a lot.")
    with pytest.raises(TextError, match="'大'"):
        respelled.check_script("I love 東京 and 大阪.")


def test_a_segment_ends_as_a_sentence():
    """A final clause mark is read as a full stop, a segment without a final mark gets one, '.', '?', '!' stay."""
    tok = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    stop = tok.encode("He came second.")
    for mark in (";", ",", ":", ""):
        ids = tok.encode(f"He came second{mark}")
        assert (SYMBOLS[ids[-1]] == mark if mark else SYMBOLS[ids[-1]] not in ".?!")
        assert tok.ending_a_sentence(ids) == stop
    assert tok.ending_a_sentence(stop) == stop and tok.ending_a_sentence([]) == []
    for ending in ("Did he come?", "He came!", "He came (at last)."):
        assert tok.ending_a_sentence(tok.encode(ending)) == tok.encode(ending)
    assert tok.ending_a_sentence(tok.encode("He came (at last)")) == tok.encode("He came (at last).")
    inner = tok.encode("Yes, he came.")
    assert tok.ending_a_sentence(inner) == inner  # only the last mark


def test_a_sentence_with_initials_has_one_full_stop_at_its_end():
    """espeak-ng keeps every full stop as a clause end; the built-in LM, trained on one sentence per utterance, stops
    speaking at the first one, so "U.S." inside a sentence used to end the speech there."""
    tok = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    symbols = [SYMBOLS[i] for i in tok.encode("J. K. Rowling lives near the U.S.A. border, at example.com.")]
    assert symbols.count(".") == 1 and symbols[-1] == "."
    assert "".join(symbols[:-1]).replace(" ", "").startswith("dʒˈeɪkˈeɪ")  # the letters are still spoken


def test_streamed_initials_wait_for_the_rest_of_the_initialism():
    """A piece that ends in "U." may go on as "S. Army": the stream holds the letter back instead of reading its
    full stop as a clause end, and reads what the whole text reads."""
    tok = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    stream = tok.stream_encoder()
    pieces = ["We met ", "in the U.", "S. Army ", "last year. Then ", "we went home."]
    streamed = [i for p in pieces for i in stream.feed(p)] + stream.flush()
    whole = tok.encode("".join(pieces))
    space = tok.index[" "]
    assert [i for i in streamed if i != space] == [i for i in whole if i != space]
    assert [SYMBOLS[i] for i in whole].count(".") == 2  # "year." and "home.", not "U." / "S."


@pytest.mark.parametrize("pieces", [["Say ", "<|ph:kədˈɛnzə|>"], ["Say <|ph:nˈuː jˈɔːɹk|>", ", now"],
                                    ["Say ", "<|ph:kə", "dˈɛnzə|> now."]])
def test_streamed_phoneme_spans_are_read_whole(pieces):
    """An inline span (a lexicon's phoneme entry, streamed text) holds ':' and may hold spaces: never cut there."""
    tok = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    stream = tok.stream_encoder()
    streamed = [i for p in pieces for i in stream.feed(p)] + stream.flush()
    space = tok.index[" "]
    assert [i for i in streamed if i != space] == [i for i in tok.encode("".join(pieces)) if i != space]


def test_frontend_reads_phonemes_when_the_folder_has_a_table(cv2_dir, tmp_path):
    from cadenza.models.cosyvoice2.config import CosyVoice2Config
    from cadenza.models.cosyvoice2.frontend import CosyVoice2Frontend
    from cadenza.models.cosyvoice2.loader import QWEN_DIR, inspect_directory

    model = tmp_path / "model"
    shutil.copytree(cv2_dir, model)
    PhonemeTable(symbols=SYMBOLS).write(model / QWEN_DIR / PHONEMES_FILE)
    files = inspect_directory(model)
    assert files.tokenizer_dir == model / QWEN_DIR
    frontend = CosyVoice2Frontend(files, CosyVoice2Config.official())
    assert frontend.reads_phonemes
    ids = frontend.text_ids("Good morning.")
    assert ids.dtype == torch.long and ids.shape[0] == 1 and int(ids.max()) < len(SYMBOLS)
    with pytest.raises(TextError, match="reads phonemes"):
        frontend.instruct_ids("Speak slowly.")
    json.loads((model / QWEN_DIR / PHONEMES_FILE).read_text())  # plain JSON, readable by any tool


@pytest.mark.parametrize(("text", "plain"), [("I love it 😀.", "I love it."), ("Great job 👍", "Great job"),
                                             ("Done ✅ now", "Done now"), ("Heart ❤️ you", "Heart you"),
                                             ("Flag 🇺🇸 here", "Flag here"), ("Family 👨\u200d👩\u200d👧 fun", "Family fun"),
                                             ("👋 Hello there!", "Hello there!")])
def test_emoji_are_not_read_by_name(text, plain):
    """espeak-ng read "Done ✅" as "done white heavy check mark"; emoji are left out, other symbols stay."""
    tok = PhonemeTokenizer(PhonemeTable(symbols=SYMBOLS))
    assert tok.encode(text) == tok.encode(plain)
    assert drop_emoji("A © B → C") == "A © B → C"  # symbols that are not emoji are read as before

