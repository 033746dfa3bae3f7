"""``cadenza`` command line: ``synth`` (text -> wav), ``vc`` (voice conversion), ``speakers`` (saved voices)."""

from __future__ import annotations

import argparse
import codecs
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from cadenza.cli.args import (
    MODEL_ENV,
    STDIO,
    add_first_hop_argument,
    add_precision_arguments,
    add_speed_method_argument,
    add_watermark_arguments,
    device,
    first_hop_argument,
    output_audio,
    precision_arguments,
    report_errors,
    seed,
    speed_method_argument,
    watermark_argument,
)
from cadenza.cli.assemble import add_assemble_parser, run_assemble
from cadenza.cli.audio_output import AudioOutput, write_stdout
from cadenza.cli.data import add_data_parser, run_data
from cadenza.cli.detect import add_detect_parser, run_detect
from cadenza.cli.evaluate import add_eval_parser, run_eval
from cadenza.cli.serve import add_serve_parser, default_voices_dir, run_serve, voices_location
from cadenza.cli.train import add_train_parser, run_train
from cadenza.cli.voices import add_voices_parser, run_voices
from cadenza.errors import CadenzaError

MAX_TEXT_FILE_CHARS = 1_000_000


def _ids(value: str) -> list[int]:
    try:
        return [int(v) for v in value.replace(",", " ").split()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from exc


def _model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=os.environ.get(MODEL_ENV),
                        help=f"model directory (CosyVoice 2 or VoxCPM 2 folder) or hub name (owner/name[@rev], "
                        f"modelscope:owner/name; a local folder of that name wins); default ${MODEL_ENV}, else the "
                        "built-in cadenza-tiny")
    parser.add_argument("--revision", help="branch, tag or commit of a hub --model (as owner/name@REV)")
    parser.add_argument("--device", type=device, default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--voices-dir", help="saved-voice store (the one `cadenza serve` uses; default "
                        "$CADENZA_VOICES_DIR or ~/.local/share/cadenza/voices when it exists)")
    parser.add_argument("--voices-db", metavar="postgresql://...",
                        help="the PostgreSQL voice store `cadenza serve --voices-db` uses (default $CADENZA_VOICES_DB)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cadenza", description="Streaming voice-cloning speech synthesis.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    synth = sub.add_parser("synth", help="speak text to an audio file (WAV, FLAC, Ogg, Opus, MP3; - for stdout)")
    _model_arg(synth)
    text = synth.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="text to speak")
    text.add_argument("--text-file", help="a UTF-8 text file of any length (split into segments, with a progress bar); "
                      "- reads standard input")
    text.add_argument("--text-ids", type=_ids, help="text token ids (for model folders without tokenizer files)")
    synth.add_argument("--prompt-wav", help="voice to clone (any rate; 0.5-30 s)")
    synth.add_argument("--reference-wav", help="VoxCPM 2: reference voice audio (no transcript needed)")
    prompt_text = synth.add_mutually_exclusive_group()
    prompt_text.add_argument("--prompt-text", help="transcript of --prompt-wav (zero-shot); omit for cross-lingual")
    prompt_text.add_argument("--prompt-text-ids", type=_ids, help="transcript as token ids")
    synth.add_argument("--instruct", help="style instruction, e.g. 'Speak cheerfully.' (instruct2 mode)")
    synth.add_argument("--speaker", help="a saved speaker id (see `cadenza speakers`)")
    synth.add_argument("--seed", type=seed, help="random seed (same seed, same audio)")
    synth.add_argument("--speed", type=float, default=1.0, help="speaking rate 0.5-2.0 (also with --stream)")
    synth.add_argument("--timestamps", metavar="JSON", help="write each word's start and end (s) to this file")
    synth.add_argument("--stream", action="store_true", help="synthesise chunk by chunk and report first-chunk latency")
    synth.add_argument("--text-stream", action="store_true",
                       help="with --text-file -: speak standard input as it arrives (a pipe from an LLM: audio "
                            "starts at its first sentence, not at the end of the input); implies --stream")
    synth.add_argument("--no-normalize", dest="normalize", action="store_false",
                       help="speak the text as written (no number/date/unit expansion)")
    synth.add_argument("--ssml", action="store_true", help="the text is SSML (also recognised by a leading <speak>)")
    synth.add_argument("--lexicon", metavar="FILE", help="pronunciation lexicon, JSON (docs/text.md)")
    synth.add_argument("--lora", help="VoxCPM 2: a LoRA folder (lora_weights.safetensors + lora_config.json, e.g. "
                       "the --out of `cadenza train voxcpm2`) applied to --model")
    add_speed_method_argument(synth)
    add_first_hop_argument(synth)
    add_precision_arguments(synth)
    add_watermark_arguments(synth)
    synth.add_argument("-o", "--output", type=output_audio, required=True,
                       help="output file: .wav, .flac, .ogg, .opus or .mp3 by its name (written whole or not at all), "
                       "or - for WAV on standard output (with --stream, each chunk as it is made)")

    design = sub.add_parser("design", help="VoxCPM 2 voice design: --text '(a warm, low voice)Hello there.'")
    _model_arg(design)
    design.add_argument("--text", required=True, help="'(description)text to speak'")
    design.add_argument("--seed", type=seed)
    design.add_argument("--stream", action="store_true")
    design.add_argument("--no-normalize", dest="normalize", action="store_false")
    design.add_argument("-o", "--output", type=output_audio, required=True)
    add_precision_arguments(design)
    add_watermark_arguments(design)

    clone = sub.add_parser("clone", help="clone a voice: --reference-wav and/or --prompt-wav with --prompt-text")
    _model_arg(clone)
    clone.add_argument("--text", required=True)
    clone.add_argument("--reference-wav", help="voice audio without transcript (VoxCPM 2 reference / "
                       "CosyVoice 2 cross-lingual)")
    clone.add_argument("--prompt-wav", help="voice audio whose transcript is --prompt-text (continuation / zero-shot)")
    clone.add_argument("--prompt-text")
    clone.add_argument("--seed", type=seed)
    clone.add_argument("--stream", action="store_true")
    clone.add_argument("--no-normalize", dest="normalize", action="store_false")
    clone.add_argument("-o", "--output", type=output_audio, required=True)
    add_precision_arguments(clone)
    add_watermark_arguments(clone)

    vc = sub.add_parser("vc", help="voice conversion: say what --source-wav says in the voice of --prompt-wav, of "
                                   "a saved --speaker, or (neither) the model's default voice")
    _model_arg(vc)
    vc.add_argument("--source-wav", required=True)
    target = vc.add_mutually_exclusive_group()
    target.add_argument("--prompt-wav", help="a recording of the target voice")
    target.add_argument("--speaker", help="a saved speaker of the model (see `cadenza speakers`)")
    vc.add_argument("--source-text", help="what --source-wav says (a model whose speech tokens are phonemes, e.g. the "
                                          "built-in one: keeps the words of a voice its tokenizer never heard)")
    vc.add_argument("--timestamps", metavar="JSON", help="with --source-text: write each of its words' start and end "
                                                     "(s) in the output to this file")
    vc.add_argument("--live-rate", type=int, metavar="HZ", help="live: read --source-wav - as raw 16-bit mono PCM at "
                                                                 "HZ from standard input, converting as it arrives")
    vc.add_argument("--seed", type=seed)
    vc.add_argument("-o", "--output", type=output_audio, required=True)
    add_precision_arguments(vc)
    add_watermark_arguments(vc)

    add_serve_parser(sub)
    add_voices_parser(sub)
    add_train_parser(sub)
    add_assemble_parser(sub)
    add_data_parser(sub)
    add_eval_parser(sub)
    add_detect_parser(sub)

    spk = sub.add_parser("speakers", help="list the model's speakers and the saved voices it can speak, or save a "
                         "speaker with --add")
    _model_arg(spk)
    spk.add_argument("--add", metavar="ID", help="save --prompt-wav/--prompt-text under this id")
    spk.add_argument("--prompt-wav")
    spk.add_argument("--prompt-text")
    return parser


_LOADED: list = []  # the models this command loaded (``_load``), closed before it returns


def _load(args):
    from cadenza.api import load
    from cadenza.builtin import resolve_model_path

    location = voices_location(args)
    if isinstance(location, str):  # --voices-db or $CADENZA_VOICES_DB: a postgresql:// URL
        voices = location
    elif args.voices_dir:  # read here, never created: a mistyped folder must not become an empty voice store
        voices = args.voices_dir
        if not Path(voices).expanduser().is_dir():
            raise CadenzaError(f"--voices-dir {voices[:200]!r} is not a folder (`cadenza serve --voices-dir` "
                               "creates one)")
    else:
        voices = str(default_voices_dir()) if default_voices_dir().is_dir() else None
    # A hub name is resolved (downloaded) once, here; everything below reads the folder.
    model = resolve_model_path(args.model or None, args.revision)
    # --dtype / --lm-int8 / --flow-int8 exist on the commands that speak; `speakers` keeps each family's default.
    precision = precision_arguments(model, getattr(args, "dtype", None), getattr(args, "lm_int8", False),
                                    args.device, getattr(args, "flow_int8", False))
    # None: the built-in cadenza-tiny. A store sqlite cannot open is the VoiceStore's InputError, naming the file.
    lora = {"lora": args.lora} if getattr(args, "lora", None) else {}  # --lora exists on `synth` only
    mark = watermark_argument(args)  # the flags exist on the commands that speak
    speed_method = speed_method_argument(args)  # --speed-method and --first-hop exist on `synth` only
    first_hop = first_hop_argument(args, model)
    tts = load(model, device=args.device, voices_dir=voices, **precision, **lora, **mark, **speed_method, **first_hop)
    _LOADED.append(tts)  # closed by main(): engine threads left running at exit could abort it (exit 134)
    return tts


def _save(audio, output: str) -> None:
    """Write ``audio`` to ``output`` whole or not at all (``Audio.save`` writes a temporary file, then renames), or
    to standard output as WAV."""
    if output == STDIO:
        from cadenza.audio.wav_stream import pcm16, wav_header

        write_stdout(wav_header(audio.sample_rate, len(audio.samples)) + pcm16(audio.samples))
        return
    try:
        audio.save(output)
    except CadenzaError as exc:
        raise CadenzaError(f"-o/--output: {exc}") from exc


def _save_words(words: list, seconds: float, path: str) -> None:
    """``--timestamps``: {"duration", "words": [{"word", "start", "end", "start_char", "end_char"}]} as JSON."""
    doc = {"duration": round(seconds, 3), "words": [w.to_dict() for w in words or []]}
    try:
        Path(path).expanduser().write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise CadenzaError(f"--timestamps: cannot write {path}: {exc.strerror or exc}") from exc


def _read_text_file(path: str) -> str:
    """The text of ``path`` (``-``: standard input), at most ``MAX_TEXT_FILE_CHARS`` characters of UTF-8."""
    name = "standard input" if path == STDIO else path
    too_long = CadenzaError(f"{name} is longer than {MAX_TEXT_FILE_CHARS} characters")
    where = name if path == STDIO else f"text file {path}"
    try:
        if path == STDIO:
            # Bytes, decoded here: the locale must not decide how the text is read. More than 4 bytes per allowed
            # character are too many characters, whatever they are.
            data = sys.stdin.buffer.read(4 * MAX_TEXT_FILE_CHARS + 1)
            if len(data) > 4 * MAX_TEXT_FILE_CHARS:
                raise too_long
            text = data.decode("utf-8")
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_TEXT_FILE_CHARS + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise CadenzaError(f"cannot read {where}: {exc}") from exc
    if len(text) > MAX_TEXT_FILE_CHARS:
        raise too_long
    return text


def _check_texts(args, text: str | None) -> None:
    """Refuse text the model cannot take (NUL, lone surrogates: e.g. argv bytes that are not UTF-8) before the
    model loads."""
    from cadenza.api import check_text_arg

    source = f"--text-file {args.text_file}" if getattr(args, "text_file", None) else "--text"
    for value, flag in ((text, source), (getattr(args, "prompt_text", None), "--prompt-text"),
                        (getattr(args, "instruct", None), "--instruct")):
        if value is not None:
            try:
                check_text_arg(value, flag)
            except CadenzaError as exc:
                if "surrogate" in str(exc):
                    raise CadenzaError(f"{exc} (is the command line in UTF-8?)") from exc
                raise


def _voice_arguments(args, names: tuple[str, ...]) -> dict:
    """The synthesis arguments given on the command line (the model refuses, naming it, what it does not take)."""
    given = {name: getattr(args, name, None) for name in names}
    return {name: value for name, value in given.items() if value is not None}


def _stdin_pieces() -> Iterator[str]:
    """Standard input as it arrives (``--text-stream``): each read's text as soon as it is there, UTF-8 decoded
    across reads, at most ``MAX_TEXT_FILE_CHARS`` characters' worth of bytes."""
    decoder, read = codecs.getincrementaldecoder("utf-8")(), 0
    fd = sys.stdin.fileno()
    try:
        while data := os.read(fd, 65536):
            read += len(data)
            if read > 4 * MAX_TEXT_FILE_CHARS:
                raise CadenzaError(f"standard input is longer than {MAX_TEXT_FILE_CHARS} characters")
            if text := decoder.decode(data):
                yield text
        if text := decoder.decode(b"", final=True):
            yield text
    except (OSError, UnicodeDecodeError) as exc:
        raise CadenzaError(f"cannot read standard input: {exc}") from exc


def _text_stream_arguments(args) -> None:
    """``--text-stream`` reads pieces of standard input: refuse what needs the whole text, before the model loads."""
    if args.text_file != STDIO:
        raise CadenzaError("--text-stream reads standard input as it arrives: give it with --text-file -")
    if args.ssml:
        raise CadenzaError("--text-stream cannot read SSML: a document is parsed whole (drop --ssml, or --text-stream)")
    if not args.normalize:
        raise CadenzaError("--text-stream normalises each sentence as it completes: --no-normalize is not supported")


def _synth(args) -> None:
    if args.text_stream:
        _text_stream_arguments(args)
        text = _stdin_pieces()
    else:
        text = _read_text_file(args.text_file) if args.text_file else args.text
        _check_texts(args, text)
        if args.ssml and text is not None:  # plain text given as SSML: refused before the model loads
            from cadenza.text.ssml import check_ssml_start

            check_ssml_start(text, "drop --ssml to read plain text")
    markup = {"input_format": "ssml"} if args.ssml else {}
    if args.lexicon is not None:
        from cadenza.text.lexicon import Lexicon

        markup["lexicon"] = Lexicon.from_file(args.lexicon)  # a bad file fails before the model loads
    if args.timestamps is not None and not Path(args.timestamps).expanduser().parent.is_dir():
        raise CadenzaError(f"--timestamps: no folder {Path(args.timestamps).expanduser().parent} to write into")
    tts = _load(args)
    kwargs = _voice_arguments(args, ("text_ids", "reference_wav", "prompt_wav", "prompt_text", "prompt_text_ids",
                                     "instruct", "speaker", "seed"))
    kwargs.update(markup)
    if args.speed != 1.0:
        kwargs["speed"] = args.speed
    if args.text_ids is None and not args.text_stream:
        kwargs["normalize"] = args.normalize
    _run(tts, text, kwargs, args.stream or args.text_stream, args.output,
         progress_bar=bool(args.text_file) and not args.text_stream, timestamps=args.timestamps)


def _design(args) -> None:
    _check_texts(args, args.text)
    tts = _load(args)
    if tts.capabilities.instructions != "voice_design":
        raise CadenzaError(f"voice design needs a model that designs voices from a description (VoxCPM 2); "
                           f"{tts.capabilities.title} takes --instruct with a voice prompt")
    if not args.text.lstrip().startswith("("):
        raise CadenzaError("voice design text starts with a description in parentheses: '(a warm voice)Hello.'")
    _run(tts, args.text, dict(seed=args.seed, normalize=args.normalize), args.stream, args.output)


def _clone(args) -> None:
    _check_texts(args, args.text)
    tts = _load(args)
    if args.reference_wav is None and args.prompt_wav is None:
        raise CadenzaError("clone needs --reference-wav and/or --prompt-wav with --prompt-text")
    if args.prompt_wav is not None and not (args.prompt_text or "").strip():
        raise CadenzaError("--prompt-wav needs its transcript --prompt-text (or pass the audio as --reference-wav)")
    kwargs = _voice_arguments(args, ("reference_wav", "prompt_wav", "prompt_text", "seed"))
    _run(tts, args.text, dict(kwargs, normalize=args.normalize), args.stream, args.output)


def _run(tts, text, kwargs: dict, stream: bool, output: str, progress_bar: bool = False,
         timestamps: str | None = None) -> None:
    """Speak ``text`` into ``output``. A file is written as the audio comes (``AudioFileWriter``: a text of any
    length needs memory for a few segments only, and the file appears whole or not at all); ``-`` gets a WAV, streamed
    with ``stream``, else whole (its header then says the exact length)."""
    from tqdm import tqdm

    if timestamps is not None:
        kwargs = dict(kwargs, timestamps=True)
    start = time.perf_counter()
    if output == STDIO and not stream:
        audio = tts.synthesize(text, **kwargs)
        elapsed, seconds, words = time.perf_counter() - start, audio.duration, audio.words
        _save(audio, output)
    else:
        words, n_pieces = [], 0
        bar = tqdm(desc="segments", unit="seg", disable=None) if progress_bar and not stream else None

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        pieces = (tts.synthesize_stream(text, **kwargs) if stream
                  else tts.synthesize_iter(text, progress=progress if bar is not None else None, **kwargs))
        try:
            with AudioOutput(output, tts.sample_rate, start) as sink:  # an output that cannot be written fails first
                for piece in pieces:
                    if timestamps is not None:  # a TimedChunk: the audio and the words it settled
                        words += piece.words
                        piece = piece.audio
                    n_pieces += 1
                    sink.write(piece)
        finally:
            if hasattr(pieces, "close"):  # a reader gone from stdout (or an error) stops the synthesis too
                pieces.close()
            if bar is not None:
                bar.close()
        elapsed, seconds = time.perf_counter() - start, sink.samples / tts.sample_rate
        if stream:
            print(f"first chunk after {sink.first_s or 0:.2f} s, {n_pieces} chunks", file=sys.stderr)
    if timestamps is not None:
        _save_words(words, seconds, timestamps)
    rtf = elapsed / seconds if seconds else float("nan")
    where = "standard output" if output == STDIO else output
    print(f"wrote {where}: {seconds:.2f} s at {tts.sample_rate} Hz in {elapsed:.2f} s (RTF {rtf:.2f})",
          file=sys.stderr)


def _vc(args) -> None:
    if args.live_rate is not None or args.source_wav == STDIO:  # before the model loads
        if args.live_rate is None or args.source_wav != STDIO or args.source_text or args.timestamps:
            raise CadenzaError("live conversion reads --source-wav - with --live-rate HZ (raw 16-bit mono PCM on "
                               "standard input), without --source-text or --timestamps")
        from cadenza.cli.live_vc import run_live

        return run_live(_load(args), args)
    if args.timestamps is not None:  # before the model loads
        if args.source_text is None:
            raise CadenzaError("--timestamps needs --source-text: the words timed are the source's")
        if not Path(args.timestamps).expanduser().parent.is_dir():
            raise CadenzaError(f"--timestamps: no folder {Path(args.timestamps).expanduser().parent} to write into")
    tts = _load(args)
    text = {"source_text": args.source_text} if args.source_text is not None else {}
    timed = {"timestamps": True} if args.timestamps is not None else {}
    audio = tts.convert_voice(args.source_wav, args.prompt_wav, seed=args.seed, speaker=args.speaker, **text, **timed)
    _save(audio, args.output)
    if args.timestamps is not None:
        _save_words(audio.words, audio.duration, args.timestamps)
    print(f"wrote {args.output}: {audio.duration:.2f} s", file=sys.stderr)


def _speakers(args) -> None:
    if args.add is not None:  # checked before the model loads
        if not args.add.strip():
            raise CadenzaError("--add needs a speaker id (1-64 letters, digits, spaces, '.', '_' or '-')")
        if not args.prompt_wav or args.prompt_text is None:
            raise CadenzaError("--add needs --prompt-wav and --prompt-text")
    elif args.prompt_wav or args.prompt_text is not None:
        raise CadenzaError("--prompt-wav/--prompt-text are only used with --add ID")
    tts = _load(args)
    if args.add is not None:
        tts.add_speaker(args.add, args.prompt_wav, args.prompt_text)
        print(f"saved speaker {args.add!r}", file=sys.stderr)
    store = getattr(tts, "voices", None)  # the saved voices of this model's family too (`cadenza voices add`)
    saved = [r.name for r in store.list() if r.family == tts.family] if store is not None else []
    for speaker in [*getattr(tts, "speakers", ()), *saved]:  # VoxCPM 2 ships no speakers: its saved voices only
        print(speaker)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    command = {"synth": _synth, "design": _design, "clone": _clone, "vc": _vc, "speakers": _speakers,
               "serve": run_serve, "voices": run_voices, "train": run_train, "assemble": run_assemble, "data": run_data, "eval": run_eval,
               "detect": run_detect}[args.command]
    try:
        return report_errors(lambda: command(args), verbose=args.verbose, unwind_on_sigterm=args.command != "train")
    finally:
        while _LOADED:
            _LOADED.pop().close()


if __name__ == "__main__":
    sys.exit(main())
