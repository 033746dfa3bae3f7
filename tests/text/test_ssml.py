"""The SSML subset: pieces and exact pause lengths, say-as expansions, what each model's frontend makes of emphasis,
rates, phonemes and languages, and errors that name the tag and its line and column."""

from __future__ import annotations

import pytest

from cadenza.errors import InputError
from cadenza.text.lexicon import Lexicon, phoneme_span
from cadenza.text.ssml import FrontendTraits, Pause, Spoken, looks_like_ssml, parse_ssml

COSYVOICE2 = FrontendTraits(emphasis=("<strong>", "</strong>"), rate=(0.5, 2.0))
PLAIN = FrontendTraits()  # no emphasis tags, no phonemes, no rate control
PHONEMES = FrontendTraits(phonemes=frozenset(" .,ˈkədɛnzəhloʊ"), languages=("en",), rate=(0.5, 2.0))


def speak(body: str) -> str:
    return f"<speak>{body}</speak>"


def words(pieces) -> str:
    return " ".join(" ".join(p.text.split()) for p in pieces if isinstance(p, Spoken))


def test_breaks_are_exact_pauses_in_place():
    pieces = parse_ssml(speak('One.<break time="250ms"/>Two.<break time="1.5s"/><break strength="weak"/>Three.'
                              '<break strength="none"/>Four.<break/>'), PLAIN)
    assert pieces == [Spoken("One."), Pause(250.0), Spoken("Two."), Pause(1750.0), Spoken("Three."),
                      Spoken("Four."), Pause(500.0)]
    assert Pause(250.0).samples(24000) == 6000
    assert Pause(12.34).samples(48000) == 592  # round(592.32)
    assert Pause(0.01).samples(24000) == 0


@pytest.mark.parametrize("kind, content, fmt, expected", [
    ("characters", "IBM2", None, "I-B-M-two"),
    ("characters", "a@b.c", None, "A-at-B-dot-C"),
    ("cardinal", "1,234", None, "one thousand two hundred thirty-four"),
    ("cardinal", "-7", None, "minus seven"),
    ("cardinal", "2024", None, "two thousand twenty-four"),  # a quantity, never read as a year
    ("ordinal", "21", None, "twenty-first"),
    ("ordinal", "3rd", None, "third"),
    ("date", "3/15/2024", "mdy", "March fifteenth, twenty twenty-four"),
    ("date", "15.03.2024", "dmy", "March fifteenth, twenty twenty-four"),
    ("date", "2024-03-15", None, "March fifteenth, twenty twenty-four"),
    ("date", "03/2024", "my", "March twenty twenty-four"),
    ("date", "7/4", "md", "July fourth"),
    ("date", "1999", "y", "nineteen ninety-nine"),
    ("telephone", "+1 (415) 555-2671", None, "plus one, four one five, five five five, two six seven one"),
    ("currency", "$12.50", None, "twelve dollars and fifty cents"),
    ("currency", "100 USD", None, "one hundred US dollars"),
])
def test_say_as(kind, content, fmt, expected):
    extra = f' format="{fmt}"' if fmt else ""
    assert words(parse_ssml(speak(f'<say-as interpret-as="{kind}"{extra}>{content}</say-as>'), PLAIN)) == expected


def test_say_as_in_chinese():
    doc = speak('<lang xml:lang="zh-CN">电话<say-as interpret-as="telephone">138-0013</say-as>，'
                '<say-as interpret-as="date">2024-03-15</say-as>，第<say-as interpret-as="cardinal">12</say-as>'
                '</lang>')
    assert parse_ssml(doc, PLAIN) == [Spoken("电话幺三八，零零幺三，二零二四年三月十五日，第十二", lang="zh")]


def test_sub_emphasis_and_text_nodes():
    doc = speak('The <sub alias="World Wide Web Consortium">W3C</sub> is <emphasis>very</emphasis> '
                '<emphasis level="reduced">calm</emphasis>.')
    assert words(parse_ssml(doc, COSYVOICE2)) == "The World Wide Web Consortium is <strong>very</strong> calm."
    assert words(parse_ssml(doc, PLAIN)) == "The World Wide Web Consortium is very calm."  # no emphasis tags: plain


def test_prosody_rate_runs_and_emphasis_across_them():
    doc = speak('<emphasis>a <prosody rate="150%">b <prosody rate="slow">c</prosody></prosody> d</emphasis>')
    assert parse_ssml(doc, COSYVOICE2) == [
        Spoken("<strong>a </strong>"), Spoken("<strong>b </strong>", rate=1.5),
        Spoken("<strong>c</strong>", rate=1.125), Spoken("<strong> d</strong>")]
    assert [p.rate for p in parse_ssml(speak('<prosody rate="+20%">x</prosody><prosody rate="0.8">y</prosody>'),
                                       COSYVOICE2)] == [1.2, 0.8]
    nested = speak('<emphasis>a <emphasis level="strong">b</emphasis></emphasis> c')
    assert parse_ssml(nested, COSYVOICE2) == [Spoken("<strong>a b</strong> c")]  # the model's tags do not nest


def test_lexicon_applies_to_text_nodes_only():
    lexicon = Lexicon.from_json([{"word": "NASA", "respelling": "nassa"}])
    doc = speak('NASA and <say-as interpret-as="characters">NASA</say-as> and <sub alias="NASA">x</sub>')
    assert words(parse_ssml(doc, PLAIN, lexicon)) == "nassa and N-A-S-A and NASA"


def test_phonemes_for_models_that_read_them():
    doc = speak('Hello <phoneme alphabet="ipa" ph="kədˈɛnzə">Cadenza</phoneme>.')
    assert words(parse_ssml(doc, PHONEMES)) == f"Hello {phoneme_span('kədˈɛnzə')}."
    with pytest.raises(InputError, match=r"<phoneme> at line 1, column 14: this model reads text"):
        parse_ssml(doc, COSYVOICE2)
    with pytest.raises(InputError, match=r"<phoneme> at line 1, column 8: phoneme symbol 'ʁ'"):
        parse_ssml(speak('<phoneme ph="ʁ">r</phoneme>'), PHONEMES)
    with pytest.raises(InputError, match="alphabet 'x-sampa'"):
        parse_ssml(speak('<phoneme alphabet="x-sampa" ph="k">r</phoneme>'), PHONEMES)


def test_languages_the_model_has():
    assert parse_ssml(speak('<lang xml:lang="en-GB">hi</lang>'), PHONEMES) == [Spoken("hi", lang="en")]
    with pytest.raises(InputError, match=r"<lang> at line 1, column 8: xml:lang 'zh'.*reads en"):
        parse_ssml(speak('<lang xml:lang="zh">你好</lang>'), PHONEMES)
    with pytest.raises(InputError, match="xml:lang 'fr'"):
        parse_ssml('<speak xml:lang="fr">bonjour</speak>', COSYVOICE2)


@pytest.mark.parametrize("doc, message", [
    (speak("Hi <audio src='x.wav'/>"), r"SSML <audio> at line 1, column 11: unsupported tag"),
    ("<speak>Hi\n  <prosody pitch='high'>x</prosody></speak>",
     r"SSML <prosody pitch> at line 2, column 3: unsupported attribute"),
    ("<speak>Hi\n<break time='5'/></speak>", r"<break> at line 2, column 1: time '5' is not a duration"),
    (speak("<break time='11s'/>x"), r"<break> at line 1, column 8: .*longer than the 10 s"),
    (speak("<break strength='huge'/>x"), "strength 'huge'"),
    (speak("x" + "<break time='10s'/>" * 61), r"<break> at line 1, column 1149: the breaks so far add up to 610 s"),
    ("<speak>Hi <emphasis>there</speak>", r"malformed SSML at line 1, column 28: mismatched tag"),
    ("<speak>Hi &nbsp; there</speak>", r"malformed SSML at line 1, column 11: undefined entity"),
    ("<speak>a</speak>junk", r"malformed SSML at line 1, column 17: junk after document element"),
    ("<speak>Hi <emphasis>there", r"incomplete SSML at line 1, column 26: the text ends before </emphasis> \(the "
     r"<emphasis> at line 1, column 11\); SSML is read as one whole <speak> document"),
    ("<speak>Hi <break time='1", r"incomplete SSML at line 1, column 11: the text ends inside a tag"),
    ("<p>Hi</p>", r"SSML <p> at line 1, column 1: the root element must be <speak>"),
    (speak("<speak>x</speak>"), r"<speak> at line 1, column 8: <speak> may only be the root"),
    (speak("<say-as interpret-as='cardinal'>1<break/></say-as>"), r"<break> .*inside <say-as>"),
    (speak("<say-as interpret-as='spell'>x</say-as>"), r"<say-as> at line 1, column 8: interpret-as 'spell'"),
    (speak("<say-as interpret-as='cardinal'>twelve</say-as>"), r"<say-as> .*'twelve' is not a number"),
    (speak("<say-as interpret-as='date' format='mdy'>3/45/2024</say-as>"), "day 45 is not 1-31"),
    (speak("<say-as interpret-as='currency'>12 apples</say-as>"), "not an amount of money"),
    (speak("<sub>W3C</sub>"), r"<sub> at line 1, column 8: needs a non-empty alias"),
    (speak("<prosody rate='400%'>x</prosody>"), r"<prosody> .*4 x the normal speed; this model speaks at 0.5 to 2"),
    (speak("<prosody rate='fastest'>x</prosody>"), "rate 'fastest'"),
    ('<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "b">]><speak>&a;</speak>', "DOCTYPE"),
    (speak("<break time='1s'/>"), "nothing to speak"),
    ("\n  Hello <break/>", r"SSML at line 2, column 3: text before the root element"),
])
def test_errors_name_the_tag_and_where(doc, message):
    with pytest.raises(InputError, match=message):
        parse_ssml(doc, COSYVOICE2)


def test_a_rate_needs_a_model_that_changes_it():
    with pytest.raises(InputError, match=r"<prosody> at line 1, column 8: rate 'fast': this model has no"):
        parse_ssml(speak("<prosody rate='fast'>x</prosody>"), PLAIN)
    assert parse_ssml(speak("<prosody rate='medium'>x</prosody>"), PLAIN) == [Spoken("x")]


def test_detection():
    assert looks_like_ssml("  <speak>hi</speak>")
    assert looks_like_ssml('<?xml version="1.0"?>\n<speak version="1.1">hi</speak>')
    assert not looks_like_ssml("<speaker> says hi")
    assert not looks_like_ssml("Say <speak> twice")
    assert not looks_like_ssml(None)
