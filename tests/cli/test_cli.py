"""The `cadenza` command, run as a real subprocess."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import soundfile as sf

from cadenza.audio.wav_stream import int16_samples


def _cadenza(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cadenza", *args], capture_output=True, text=True, timeout=timeout)


def test_synth_writes_a_valid_wav_from_the_fixture_folder(cv2_dir, tmp_path):
    out = tmp_path / "fixture.wav"
    proc = _cadenza("synth", "--model", str(cv2_dir), "--text-ids", "5,17,42,99,3,250,7", "--seed", "1", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    audio, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and audio.ndim == 1 and len(audio) > 0 and np.isfinite(audio).all()
    assert "RTF" in proc.stderr
    # Same seed, same file.
    again = tmp_path / "again.wav"
    assert _cadenza("synth", "--model", str(cv2_dir), "--text-ids", "5,17,42,99,3,250,7", "--seed", "1",
                    "-o", str(again)).returncode == 0
    np.testing.assert_array_equal(audio, sf.read(again, dtype="float32")[0])


def test_streaming_synth(cv2_dir, tmp_path):
    out = tmp_path / "stream.wav"
    proc = _cadenza("synth", "--model", str(cv2_dir), "--text-ids", "5,17,42,99,3,250,7,8,9,10,11,12,13,14", "--seed",
                    "2", "--stream", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "first chunk after" in proc.stderr and sf.info(out).samplerate == 24000


def test_errors_are_one_clear_line(cv2_dir, tmp_path):
    proc = _cadenza("synth", "--model", str(tmp_path / "missing"), "--text", "hi", "-o", str(tmp_path / "x.wav"))
    assert proc.returncode == 2 and "error: model directory not found" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _cadenza("synth", "--model", str(cv2_dir), "--text", "hello", "-o", str(tmp_path / "x.wav"))
    assert proc.returncode == 2 and "no text tokenizer" in proc.stderr and "--text-ids" in proc.stderr
    proc = _cadenza("synth", "--model", str(cv2_dir), "--text-ids", "1,x", "-o", str(tmp_path / "x.wav"))
    assert proc.returncode == 2 and "comma-separated integers" in proc.stderr
    for flag, value, message in (("--max-queued", "-1", "expected an integer >= 0, got -1"),
                                 ("--max-active", "0", "expected a positive integer, got 0"),
                                 ("--vocoder-workers", "two", "expected a positive integer, got 'two'"),
                                 ("--first-audio-pause", "never", "invalid choice: 'never'"),
                                 ("--flow-cache-budget-mb", "-5", "expected 'auto', 'none' or MiB >= 0, got '-5'"),
                                 ("--flow-cache-budget-mb", "half", "expected 'auto', 'none' or MiB >= 0, got 'half'")):
        proc = _cadenza("serve", flag, value)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_text_file_long_form(cv2_dir, tmp_path):
    from toy_model import build_toy_model_dir

    model = build_toy_model_dir(cv2_dir, tmp_path / "model")
    text = tmp_path / "story.txt"
    text.write_text("Chapter one. It was 3 pm and raining.\n\nThe story ended on 2024-01-01, as planned.\n" * 3)
    out = tmp_path / "story.wav"
    proc = _cadenza("synth", "--model", str(model), "--text-file", str(text), "--seed", "3", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sf.info(out).duration > 0
    proc = _cadenza("synth", "--model", str(model), "--text-file", str(tmp_path / "nope.txt"), "-o", str(out))
    assert proc.returncode == 2 and "cannot read text file" in proc.stderr


def test_stdout_gets_a_streamed_wav_while_it_speaks(tmp_path):
    """`--stream -o -` (the built-in model): a WAV header saying "until the end", then each chunk as it is made, so
    a player reading the pipe starts before the synthesis ends; the samples are the streamed file's."""
    text = "The first sentence is short. A second one ends it."  # two segments, several chunks
    argv = [sys.executable, "-m", "cadenza", "synth", "--text", text, "--seed", "4", "--stream", "-o", "-"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        header = proc.stdout.read(44)
        first = proc.stdout.read(2 * 2400)  # 0.1 s of audio
        running_at_first_audio = proc.poll() is None
        rest = proc.stdout.read()
        err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    assert header[:4] == b"RIFF" and header[4:8] == b"\xff\xff\xff\xff" and header[40:44] == b"\xff\xff\xff\xff"
    assert int.from_bytes(header[24:28], "little") == 24000 and len(first) == 4800
    assert running_at_first_audio, "the first audio reached stdout only after the command had finished"
    assert "wrote standard output" in err
    piped = np.frombuffer(first + rest, dtype="<i2")
    out = tmp_path / "stream.wav"
    assert _cadenza("synth", "--text", text, "--seed", "4", "--stream", "-o", str(out)).returncode == 0
    np.testing.assert_array_equal(piped, sf.read(out, dtype="int16")[0])
    # Not streamed: one WAV with exact sizes.
    proc = subprocess.run(argv[:-3] + ["-o", "-"], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    audio, sr = sf.read(io.BytesIO(proc.stdout), dtype="int16")
    assert sr == 24000 and int.from_bytes(proc.stdout[40:44], "little") == 2 * len(audio) > 0


def test_output_format_follows_the_file_name(cli, tmp_path):
    for name, fmt in (("a.flac", "FLAC"), ("b.ogg", "OGG"), ("c.opus", "OGG"), ("d.MP3", "MP3"), ("e.wav", "WAV")):
        code, _, err = cli("synth", "--text", "Hello there.", "--seed", "1", "-o", tmp_path / name)
        assert code == 0, err
        info = sf.info(str(tmp_path / name))
        assert info.format == fmt and info.samplerate == 24000 and info.duration > 0.3, (name, info)
    flac, wav = sf.read(tmp_path / "a.flac", dtype="int16")[0], sf.read(tmp_path / "e.wav", dtype="int16")[0]
    np.testing.assert_array_equal(flac, wav)  # lossless, and the same seed is the same speech
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.flac", "b.ogg", "c.opus", "d.MP3", "e.wav"]


def test_text_from_standard_input(tmp_path):
    """`--text-file -` reads the text from a pipe (it opened a file named '-'), as UTF-8 whatever the locale."""
    text = "Café au lait, from a pipe."
    piped, typed = tmp_path / "piped.wav", tmp_path / "typed.wav"
    proc = subprocess.run([sys.executable, "-m", "cadenza", "synth", "--text-file", "-", "--seed", "2", "-o", str(piped)],
                          input=text.encode(), capture_output=True, timeout=300, env={**os.environ, "LC_ALL": "C"})
    assert proc.returncode == 0, proc.stderr
    assert _cadenza("synth", "--text", text, "--seed", "2", "-o", str(typed)).returncode == 0
    np.testing.assert_array_equal(sf.read(piped, dtype="int16")[0], sf.read(typed, dtype="int16")[0])
    proc = subprocess.run([sys.executable, "-m", "cadenza", "synth", "--text-file", "-", "-o", str(piped)],
                          input=b"caf\xe9", capture_output=True, text=False, timeout=300)
    assert proc.returncode == 2 and b"error: cannot read standard input: 'utf-8' codec can't decode" in proc.stderr


def test_a_text_file_is_written_to_the_file_as_it_is_spoken(builtin_tts, tmp_path):
    """`--text-file` (the built-in model): each segment goes to a temporary file beside the output as soon as it is
    made (a text of any length needs memory for a few segments, not the whole audio), renamed over the output at the
    end; the samples and the word timings are the Python API's."""
    sentences = ["The rain stopped before noon.", "We walked along the river to the old bridge.",
                 "A boat was waiting there.", "Nobody knew who had left it.", "The water was calm and very cold.",
                 "By evening the sky was clear again."] * 2
    text = " ".join(sentences)
    (tmp_path / "story.txt").write_text(text)
    out, words = tmp_path / "story.wav", tmp_path / "story.json"
    argv = [sys.executable, "-m", "cadenza", "synth", "--text-file", str(tmp_path / "story.txt"), "--seed", "6",
            "--dtype", "float32",  # the API's default (auto is bfloat16 on some CPUs)
            "-o", str(out), "--timestamps", str(words)]
    sizes: list[tuple[float, int]] = []  # (time, size) of the temporary file while the command runs
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        while proc.poll() is None:
            partial = [p for p in tmp_path.iterdir() if p.name.startswith(".story.wav.") and p.name.endswith(".tmp")]
            try:
                if partial and not out.exists():
                    sizes.append((time.monotonic(), partial[0].stat().st_size))
            except FileNotFoundError:  # renamed meanwhile
                pass
            time.sleep(0.02)
        err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    # It grew over time (a whole file written at the end would go from nothing to its size within milliseconds).
    grown = [(t2 - t1) for t1, s1 in sizes for t2, s2 in sizes if 0 < s1 < s2]
    assert grown and max(grown) > 0.3, sizes[:: max(1, len(sizes) // 20)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["story.json", "story.txt", "story.wav"]
    expected = builtin_tts.synthesize(text, seed=6, timestamps=True)
    written, sr = sf.read(out, dtype="int16")
    assert sr == 24000
    np.testing.assert_array_equal(written, int16_samples(expected.samples))
    doc = json.loads(words.read_text())
    assert [w["word"] for w in doc["words"]] == text.split() and doc["duration"] == round(expected.duration, 3)


def test_sigterm_while_writing_leaves_no_partial_file(tmp_path):
    """`kill`, `docker stop` or systemd send SIGTERM: the command unwinds as on Ctrl-C (exit 143, one error line) and
    removes the temporary file it was writing (Python's default action for SIGTERM dies on the spot and left it)."""
    (tmp_path / "long.txt").write_text("The rain stopped before noon and we walked to the river. " * 60)
    out = tmp_path / "long.wav"
    argv = [sys.executable, "-m", "cadenza", "synth", "--text-file", str(tmp_path / "long.txt"), "-o", str(out)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 240
        while not any(p.name.endswith(".tmp") and p.stat().st_size > 44 for p in tmp_path.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143 and err.strip().endswith("error: terminated"), (proc.returncode, err[-2000:])
    assert [p.name for p in tmp_path.iterdir()] == ["long.txt"]


def test_serve_stops_gracefully_on_sigterm(tmp_path):
    """SIGTERM: uvicorn drains and shuts down, then the models and the voice store are closed and the exit code is
    0, as on Ctrl-C (uvicorn re-raises the signal after its shutdown; with the default action the process then died
    by it, -15, without closing them)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "cadenza", "serve", "--port", str(port), "--voices-dir", str(tmp_path / "voices"),
            "--no-warmup"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0 and "Application shutdown complete" in err, (proc.returncode, err[-2000:])
    assert "error:" not in err


def test_text_stream_speaks_standard_input_as_it_arrives(tmp_path):
    """`--text-file - --text-stream` (a pipe from an LLM): audio comes out while the input is still open, and the
    whole input is spoken once it ends; what needs the whole text is refused before the model loads."""
    import select

    argv = [sys.executable, "-m", "cadenza", "synth", "--text-file", "-", "--text-stream", "--seed", "1", "-o", "-",
            "--timestamps", str(tmp_path / "words.json")]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdin.write(b"Hello there, this is the first sentence. And the sec")  # the second one is cut
        proc.stdin.flush()
        head, deadline = b"", time.monotonic() + 240
        while len(head) < 44 + 4800:  # the WAV header and 0.1 s of audio
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            if select.select([proc.stdout], [], [], 0.5)[0]:
                head += os.read(proc.stdout.fileno(), 65536)
        proc.stdin.write("ond one ends here, café.\n".encode())
        proc.stdin.close()
        rest = proc.stdout.read()
        err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    audio = np.frombuffer((head + rest)[44:], dtype="<i2")
    assert head[:4] == b"RIFF" and audio.size > 2 * 24000 and np.abs(audio).max() > 1000
    doc = json.loads((tmp_path / "words.json").read_text())
    assert " ".join(w["word"] for w in doc["words"]) == ("Hello there, this is the first sentence. "
                                                         "And the second one ends here, café.")
    for flags, stdin, message in ((["--text-file", str(tmp_path / "words.json")], b"", "give it with --text-file -"),
                                  (["--text-file", "-", "--ssml"], b"<speak>Hi</speak>", "cannot read SSML"),
                                  (["--text-file", "-"], b"\xff\xfe", "cannot read standard input: 'utf-8' codec"),
                                  (["--text-file", "-"], b"...", "the text stream ended with nothing to speak")):
        proc = subprocess.run([sys.executable, "-m", "cadenza", "synth", *flags, "--text-stream", "-o",
                               str(tmp_path / "x.wav")], input=stdin, capture_output=True, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr.decode(), proc.stderr.decode()[-2000:]
    assert not (tmp_path / "x.wav").exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_voices_add_saves_a_voice_that_synth_speaks_with(tmp_path):
    """`cadenza voices add` (no server): the model's features are computed and saved in one transaction with the
    consent record, exactly as POST /v1/audio/voices does; `synth --speaker` then speaks with it, and a refused
    voice leaves nothing behind."""
    from test_server_harness import CONSENT, speech_prompt

    samples, sr = speech_prompt(3.0)
    sf.write(tmp_path / "me.wav", samples, sr)
    store = str(tmp_path / "voices")
    add = ["voices", "--voices-dir", store, "add"]
    proc = _cadenza(*add, "me", "--audio", str(tmp_path / "me.wav"), "--consent", CONSENT, "--declared-by", "Me")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert (record["name"], record["family"], record["declared_by"], record["audio_kept"]) == (
        "me", "cosyvoice2", "Me", False)
    consent = json.loads(_cadenza("voices", "--voices-dir", store, "consent", "me").stdout)
    assert consent["declaration"] == CONSENT and consent["voice_id"] == record["id"]
    proc = _cadenza("synth", "--voices-dir", store, "--speaker", "me", "--text", "Hello there.", "--seed", "1",
                    "-o", str(tmp_path / "out.wav"))
    assert proc.returncode == 0, proc.stderr
    assert sf.info(tmp_path / "out.wav").duration > 0.3
    for args, message in ((["me", "--audio", str(tmp_path / "me.wav")], "a voice named 'me' already exists"),
                          (["x", "--audio", str(tmp_path / "nope.wav")], "no such file"),
                          (["x", "--audio", str(tmp_path / "out.wav"), "--audio-retention-days", "3"],
                           "with --keep-audio"),
                          (["../x", "--audio", str(tmp_path / "me.wav")], "invalid voice name")):
        proc = _cadenza(*add, *args, "--consent", CONSENT)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    listed = [json.loads(line)["name"] for line in _cadenza("voices", "--voices-dir", store, "list").stdout.splitlines()]
    assert listed == ["me"]


def test_sigterm_unwinds_every_command_but_training():
    """In process: the command sees its own SIGTERM handler (a Python exception that unwinds it) unless it trains,
    where torchrun stops workers with SIGTERM and the default action stays; the previous handler is back after."""
    from cadenza.cli.args import report_errors

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        def default_action() -> int:
            return 0 if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else 7

        assert report_errors(default_action) == 7
        assert report_errors(default_action, unwind_on_sigterm=False) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_live_vc_converts_standard_input_as_it_arrives(builtin_tts, tmp_path):
    """`vc --source-wav - --live-rate 16000` (a pipe from a microphone): converted audio comes out while the source is
    still open, as long as the source once it ends; the live flags are checked before the model loads."""
    import select

    import torch

    from cadenza.audio.resample import resample

    line = builtin_tts.synthesize("Please close the window before you leave the house tonight.", seed=3)
    pcm = (resample(torch.from_numpy(line.samples), line.sample_rate, 16000).numpy() * 32767).astype("<i2").tobytes()
    argv = [sys.executable, "-m", "cadenza", "vc", "--source-wav", "-", "--live-rate", "16000", "--seed", "1", "-o",
            "-"]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdin.write(pcm[:64001])  # 2 s and an odd byte
        proc.stdin.flush()
        head, deadline = b"", time.monotonic() + 240
        while len(head) < 44 + 4800:  # the WAV header and 0.1 s of audio, before the source has ended
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            if select.select([proc.stdout], [], [], 0.5)[0]:
                head += os.read(proc.stdout.fileno(), 65536)
        proc.stdin.write(pcm[64001:])
        proc.stdin.close()
        rest = proc.stdout.read()
        err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    audio = np.frombuffer((head + rest)[44:], dtype="<i2")
    assert head[:4] == b"RIFF" and np.abs(audio).max() > 1000
    assert audio.size == len(pcm) // 2 // 640 * 960  # one 40 ms hop of output per 40 ms token of source
    for flags in (["--source-wav", "-"], ["--source-wav", str(tmp_path / "x.wav"), "--live-rate", "16000"],
                  ["--source-wav", "-", "--live-rate", "16000", "--source-text", "Hi."]):
        proc = subprocess.run([sys.executable, "-m", "cadenza", "vc", *flags, "-o", str(tmp_path / "y.wav")],
                              input=b"", capture_output=True, timeout=300)
        assert proc.returncode == 2 and "live conversion reads --source-wav - with --live-rate" in proc.stderr.decode()
    proc = subprocess.run(argv, input=pcm[:3200], capture_output=True, timeout=300)
    assert proc.returncode == 2 and "too short: 0.10 s" in proc.stderr.decode(), proc.stderr.decode()[-2000:]


def test_dev_stdout_is_standard_output_redirected_or_piped(tmp_path):
    """``-o /dev/stdout`` is ``-o -``: redirected into a file, that file gets the WAV (the device was once replaced
    by a regular file holding it, the redirect left empty); piped, a reader gets it (libsndfile cannot seek a pipe)."""
    argv = [sys.executable, "-m", "cadenza", "synth", "--text", "Hello there.", "--seed", "2", "-o", "/dev/stdout"]
    redirected = tmp_path / "out.wav"
    with open(redirected, "wb") as handle:
        proc = subprocess.run(argv, stdout=handle, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert os.path.islink("/dev/stdout") or not os.path.isfile("/dev/stdout")
    whole, sr = sf.read(redirected, dtype="int16")
    assert sr == 24000 and whole.size > 12000
    piped = subprocess.run(argv, capture_output=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert np.array_equal(sf.read(io.BytesIO(piped.stdout), dtype="int16")[0], whole)
