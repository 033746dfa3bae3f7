"""Any text a user can send, plain or SSML, through the built-in model's whole text path (SSML parsing, lexicon,
normalisation, segmentation, espeak-ng phonemes, request building: what ``synthesize`` and the server run before the
LM): it is refused with an ``InputError`` or it becomes requests that each have text ids. Never another exception,
never an empty request (an LM given no text speaks nothing or babbles)."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cadenza.api.markup import make_script, plan_script
from cadenza.engine.request import SynthesisRequest
from cadenza.errors import InputError
from cadenza.text.lexicon import Lexicon

_PIECES = [
    "<speak>", "</speak>", '<break time="200ms"/>', '<break strength="weak"/>', '<break time="-1s"/>',
    '<say-as interpret-as="characters">', '<say-as interpret-as="date" format="mdy">', "</say-as>",
    '<say-as interpret-as="telephone">', '<say-as interpret-as="currency">', '<say-as interpret-as="ordinal">',
    '<sub alias="x">', "</sub>", '<prosody rate="fast">', '<prosody rate="150%">', "</prosody>", "<emphasis>",
    "</emphasis>", '<phoneme alphabet="ipa" ph="həˈloʊ">', "</phoneme>", '<lang xml:lang="zh-CN">', "</lang>",
    "&amp;", "&lt;", "<", ">", "&", "<p>", "</p>", "<s>", "</s>", "<!-- c -->", "<![CDATA[x]]>",
    "Hello", " world", ".", ",", "?", "!", "5", "12/25/2024", "$3.50", "Dr.", "St.", "e.g.", "C#", "(", ")", "[",
    "]", "'", '"', "-", "—", "…", "我", "你好", "。", "\n", "  ", "**", "#", "`", "_", "😀", "é", "ß", "Ω", "\u200b",
    "\u0301", "<|ph:hɛ|>", "<|", "|>", "[laughter]", "<strong>", "</strong>", "Cadenza", "NGINX's",
]
_TEXT = st.lists(st.sampled_from(_PIECES) | st.text(max_size=3), min_size=1, max_size=14).map("".join)
_LEXICON = Lexicon.from_json([{"word": "Cadenza", "respelling": "kuh DEN zuh"}, {"word": "Hello", "phonemes": "həˈloʊ"}])


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(_TEXT, st.sampled_from([None, "text", "ssml"]), st.booleans())
@example("<speak><break time='1s'/></speak>", "ssml", False)  # only a pause: exact silence, no request
@example("\u0301\u200b", None, False)
def test_any_text_is_refused_or_becomes_requests_with_text(builtin_tts, text, input_format, with_lexicon):
    try:
        script = make_script(builtin_tts, text, input_format=input_format, lexicon=_LEXICON if with_lexicon else None)
        items, n_text = plan_script(builtin_tts, script, None, seed=1)
    except InputError as e:
        assert str(e)  # a message the user can act on
        return
    requests = [item for item in items if isinstance(item, SynthesisRequest)]
    assert all(r.text_ids is not None and r.text_ids.numel() > 0 for r in requests)
    assert n_text >= len(requests)
