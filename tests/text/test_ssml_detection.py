"""Telling SSML from plain text, one rule everywhere (``looks_like_ssml``, and ``ssml_start`` for text still arriving):
a leading ``<speak`` after spaces, byte-order marks and an optional ``<?xml ...?>``. What is detected is also parsed
(a BOM or a blank line before the declaration is not an error), errors still say where in the caller's text, and
text in pieces that starts as SSML is refused rather than read aloud tag by tag."""

from __future__ import annotations

import pytest

from cadenza.api.markup import refusing_ssml
from cadenza.errors import InputError
from cadenza.text.ssml import FrontendTraits, Pause, Spoken, check_ssml_start, looks_like_ssml, parse_ssml, ssml_start

TRAITS = FrontendTraits(emphasis=("<strong>", "</strong>"), rate=(0.5, 2.0))
DOC = '<speak>Hello <break time="1s"/> there.</speak>'
DECLARED = '<?xml version="1.0" encoding="UTF-8"?>\n' + DOC
BOM = "\ufeff"


@pytest.mark.parametrize("text", [BOM + DOC, BOM + DOC + "\n", BOM + DECLARED, f"{BOM}\r\n  {DOC}", "\n" + DECLARED,
                                  "\n\n  " + DECLARED, f"{BOM}\n{DECLARED}", " \t\n" + DOC])
def test_a_bom_or_leading_spaces_before_the_document_are_ssml_and_parse(text):
    assert looks_like_ssml(text)
    assert parse_ssml(text, TRAITS) == [Spoken("Hello "), Pause(1000.0), Spoken(" there.")]


@pytest.mark.parametrize("text", [BOM + "Hello <speak>", BOM, "\n<?xml version='1.0'?>", "<speaker>Hi</speaker>",
                                  BOM + "<?xml version='1.0' <speak>", "<p>Hi</p>", " <spea"])
def test_plain_text_is_not_ssml(text):
    assert not looks_like_ssml(text)


def test_errors_count_lines_and_columns_in_the_callers_text():
    # The document handed to expat starts past the spaces and the BOM; positions are still the caller's.
    with pytest.raises(InputError, match=r"SSML <audio> at line 3, column 29: unsupported tag"):
        parse_ssml(f'{BOM}\n\n<?xml version="1.0"?><speak><audio/></speak>', TRAITS)
    with pytest.raises(InputError, match=r"SSML <audio> at line 1, column 10: unsupported tag"):
        parse_ssml(f"{BOM}  <speak><audio/></speak>", TRAITS)  # the BOM takes no column: editors hide it
    with pytest.raises(InputError, match=r"malformed SSML at line 2, column 11: mismatched tag"):
        parse_ssml("\r\n <speak></p></speak>", TRAITS)
    with pytest.raises(InputError, match=r"incomplete SSML at line 2, column 11: .* \(the <speak> at line 2, column 2\)"):
        parse_ssml("\n <speak>Hi", TRAITS)
    with pytest.raises(InputError, match=r"SSML at line 2, column 1: text before the root element"):
        parse_ssml(f"{BOM}\n{BOM}Hello", TRAITS)


def test_the_plain_text_hint_names_the_callers_option():
    with pytest.raises(InputError, match=r"line 1, column 1: .*send plain text with input_format 'text'\)"):
        check_ssml_start("Hello")
    with pytest.raises(InputError, match=r"\(SSML starts with <speak>; drop --ssml to read plain text\)"):
        check_ssml_start(BOM + "Hello", "drop --ssml to read plain text")
    assert check_ssml_start(BOM + "\n " + DOC) == 3  # where the document starts


@pytest.mark.parametrize(("text", "start"), [
    ("", None), ("  \n", None), (BOM, None), ("<", None), ("<sp", None), ("<speak", None), ("<?x", None),
    ("<?xml version='1.0'", None), ("<?xml version='1.0'?>\n", None), ("<?xml version='1.0'?><spe", None),
    (BOM + "<speak>", True), ("<speak ", True), ("\n<?xml?>\n<speak xml:lang='en'>", True),
    ("Hello", False), ("<p>", False), ("<speaker", False), ("<speak-", False), (" <3 you", False),
    ("<?xml?>Hi", False),
])
def test_ssml_start_tells_as_soon_as_the_text_so_far_can(text, start):
    assert ssml_start(text) is start


def _read(pieces) -> list:
    return list(refusing_ssml(iter(pieces)))


@pytest.mark.parametrize("pieces", [["<speak>Hello there, ", "my friend.</speak>"], ["<", "spe", "ak>Hi</speak>"],
                                    [BOM, "<speak>Hi</speak>"], ["\n", "<?xml version='1.0'?>", "\n<speak>Hi"],
                                    ["<?xml ", "version='1.0'?><speak", ">Hi</speak>"], ["  <speak"]])
def test_text_in_pieces_that_starts_as_ssml_is_refused(pieces):
    with pytest.raises(InputError, match=r"SSML is read as one whole document, and these text pieces start with "
                                         r"<speak>: give it as one string.*without --text-stream.*WebSocket"):
        _read(pieces)


@pytest.mark.parametrize("pieces", [["Hello ", "<speak>there"], ["<", "3 you"], ["  ", "\n"], ["<speaker> Hi"],
                                    ["<?xml version='1.0'?>", " Hi"], []])
def test_plain_text_in_pieces_passes_as_it_came(pieces):
    assert _read(pieces) == pieces


def test_pieces_are_held_back_only_until_their_start_tells():
    read: list[str] = []

    def upstream():
        for piece in ["  ", "<", "b>Hi", "</b> there", "<speak>"]:
            read.append(piece)
            yield piece

    out = refusing_ssml(upstream())
    assert next(out) == "  " and read == ["  ", "<", "b>Hi"]  # "<b" is not SSML: the held pieces go on at once
    assert list(out) == ["<", "b>Hi", "</b> there", "<speak>"]
    weird = [BOM, 42, "<speak>"]  # not text: passed on for the bi-stream to name it
    assert _read(weird) == weird
