"""Argument types, names and error reporting shared by the ``cadenza`` sub-commands.

Every type here raises ``argparse.ArgumentTypeError`` with the offending value, so argparse prints
``cadenza <cmd>: error: argument --flag: <reason>`` and exits with code 2 before anything is loaded.
``report_errors`` turns what a command raises into one ``error: ...`` line on stderr (never a traceback).
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

MODEL_ENV = "CADENZA_MODEL"  # default model directory of every command (else the built-in cadenza-tiny)
MAX_SEED = 2**63 - 1  # a request's RNG is seeded with a signed 64-bit integer
MAX_ERROR_CHARS = 2000  # a message that echoes a hostile value (10 kB names) is cut here

log = logging.getLogger("cadenza.cli")


def _int_at_least(value: str, minimum: int, what: str, maximum: int | None = None) -> int:
    try:
        n = int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value[:80]!r}") from exc
    if n < minimum or (maximum is not None and n > maximum):
        raise argparse.ArgumentTypeError(f"expected {what}, got {n}")
    return n


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(value, 1, "a positive integer")


def nonnegative_int(value: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(value, 0, "an integer >= 0")


def seed(value: str) -> int:
    """argparse type: a random seed, 0 <= seed < 2**63."""
    return _int_at_least(value, 0, "an integer from 0 to 2**63-1", MAX_SEED)


def port(value: str) -> int:
    """argparse type: a TCP port, 1-65535."""
    return _int_at_least(value, 1, "a port number from 1 to 65535", 65535)


def positive_float(value: str) -> float:
    """argparse type: a finite number > 0 (``nan``, ``inf`` and ``0`` are refused)."""
    try:
        x = float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value[:80]!r}") from exc
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {value[:80]!r}")
    return x


def nonnegative_float(value: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        x = float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value[:80]!r}") from exc
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {value[:80]!r}")
    return x


def flow_cache_budget_arg(value: str) -> float | str | None:
    """argparse type of ``--flow-cache-budget-mb``: ``auto``, ``none`` or MiB >= 0 (``SchedulerConfig``)."""
    word = value.strip().lower()
    if word in ("auto", "none"):
        return None if word == "none" else "auto"
    try:
        return nonnegative_float(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'auto', 'none' or MiB >= 0, got {value[:80]!r}") from None


def device(value: str) -> str:
    """argparse type: a torch device string this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``)."""
    if value == "cpu":
        return value
    from cadenza.api import check_device
    from cadenza.errors import InputError

    try:
        check_device(value)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


STDIO = "-"


def output_audio(value: str) -> str:
    """argparse type: the audio file to write, or ``-`` for standard output (WAV). Its folder must exist, it must
    not be a folder, and its suffix names a format cadenza writes (``.wav``, ``.flac``, ``.ogg``, ``.opus``,
    ``.mp3``; none: WAV), so ``out.m4a`` is refused instead of holding another format under a misleading name."""
    from cadenza.audio.io import output_format
    from cadenza.errors import AudioError

    if value == STDIO:
        return value
    if not value.strip():
        raise argparse.ArgumentTypeError("the output path is empty")
    from cadenza.audio.file_writer import names_stdout

    path = Path(value).expanduser()
    try:
        if path.suffix.lower() in ("", ".wav") and names_stdout(path):
            return STDIO  # -o /dev/stdout is -o -: a WAV stream, which a pipe takes and a redirected file gets whole
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{value!r} is a folder: name the audio file to write")
        parent = path.parent
        if not parent.is_dir():
            raise argparse.ArgumentTypeError(f"the folder {str(parent)[:200]!r} does not exist")
    except (OSError, ValueError) as exc:  # name too long, NUL byte, not encodable
        raise argparse.ArgumentTypeError(f"cannot use {value[:200]!r} as an output file: {exc}") from exc
    try:
        output_format(path)
    except AudioError as exc:
        raise argparse.ArgumentTypeError(f"{value[:200]!r}: {exc}") from exc
    return value


def one_line(message: str) -> str:
    """``message`` on one line (newlines folded), cut to ``MAX_ERROR_CHARS``."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + f"... ({len(text)} characters)"


class Terminated(BaseException):
    """SIGTERM (``kill``, ``docker stop``, systemd) while a command runs. Raised in the main thread, so the command
    unwinds as on Ctrl-C: an output file being written is removed, not left half-made (Python's default for SIGTERM is
    to die on the spot, leaving the temporary file behind)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


def report_errors(command: Callable[[], int | None], verbose: bool = False, unwind_on_sigterm: bool = True) -> int:
    """Run ``command``; a ``CadenzaError`` (and any other failure) becomes one ``error: ...`` line on stderr.

    Exit codes: 0 success, 2 bad input or a file that cannot be used (``CadenzaError``, ``OSError``), 130
    interrupted (Ctrl-C), 143 terminated (SIGTERM, with ``unwind_on_sigterm``), 1 an unexpected failure (a bug:
    ``-v`` logs its traceback). Training keeps SIGTERM's default action (``unwind_on_sigterm=False``): torchrun stops
    its workers with it, and a worker blocked in a collective would run a Python handler only when the collective
    returns.
    """
    from cadenza.errors import CadenzaError

    # Only where SIGTERM still has its default action (a host program's own handler stays; a server installs its own).
    on_term = (unwind_on_sigterm and threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    if on_term:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return int(command() or 0)
    except Terminated:
        print("error: terminated", file=sys.stderr)
        return 143
    except CadenzaError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a file or folder the command could not use; the message names it
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback for users
        if verbose:
            log.exception("unexpected failure")
        print(f"error: unexpected {type(exc).__name__}: {one_line(str(exc))} (a bug: please report it; "
              "-v prints the traceback)", file=sys.stderr)
        return 1
    finally:
        if on_term and signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


# --dtype choices; equal to cadenza.engine.precision.DTYPE_CHOICES (not imported here: argparse must not wait for torch)
DTYPES = ("auto", "float32", "bfloat16")
DEFAULT_DTYPE = "auto"


# --speed-method choices; equal to cadenza.engine.stream_schedule.SPEED_METHODS (not imported: argparse must not wait
# for torch)
SPEED_METHODS = ("auto", "phase_vocoder", "wsola", "mel", "flow")


def add_speed_method_argument(parser: argparse.ArgumentParser) -> None:
    """``--speed-method``: how ``speed != 1`` changes the rate (docs/controls.md, "Speed")."""
    parser.add_argument("--speed-method", choices=SPEED_METHODS, default=None,
                        help="how a speed other than 1 changes the rate: auto (the default: a phase vocoder to speed "
                             "up, WSOLA to slow down), phase_vocoder or wsola (one of them at every rate), or for "
                             "CosyVoice 2 also mel (the mel stretched before the vocoder) and flow (the flow's own "
                             "rate); default: what the model folder's cadenza.json names, else auto")


def speed_method_argument(args: argparse.Namespace) -> dict:
    """The ``speed_method=`` keyword ``cadenza.api.load`` gets for ``--speed-method`` (none when it is not given)."""
    method = getattr(args, "speed_method", None)
    return {} if method is None else {"speed_method": method}


MAX_FIRST_HOP = 100  # StreamSchedule().token_max_hop_len (not imported: argparse must not wait for torch)


def _first_hop(text: str) -> int:
    try:
        tokens = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of tokens: {text[:40]!r}") from None
    if not 1 <= tokens <= MAX_FIRST_HOP:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_FIRST_HOP} tokens, got {tokens}")
    return tokens


def add_first_hop_argument(parser: argparse.ArgumentParser) -> None:
    """``--first-hop``: the speech tokens of a CosyVoice 2 stream's first chunk (docs/performance.md, "The first chunk
    of any voice")."""
    parser.add_argument("--first-hop", type=_first_hop, default=None, metavar="TOKENS",
                        help="CosyVoice 2 streaming: speech tokens (40 ms each) in a stream's first chunk, 1-100 "
                             "(default 25). Fewer start the audio sooner, but the second chunk must be made while "
                             "the first plays: for hardware that speaks many times faster than real time")


def first_hop_argument(args: argparse.Namespace, folder) -> dict:
    """The ``stream_schedule=`` keyword ``cadenza.api.load`` gets for ``--first-hop`` on a CosyVoice 2 ``folder``
    (none when the flag is not given or the model is of another family, which streams otherwise)."""
    tokens = getattr(args, "first_hop", None)
    if tokens is None:
        return {}
    from cadenza.api.loading import model_family
    from cadenza.engine.stream_schedule import StreamSchedule

    if model_family(folder) != "cosyvoice2":
        return {}
    return {"stream_schedule": StreamSchedule(first_hop_len=tokens)}  # the folder's speed method stays (load)


def add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dtype``, ``--lm-int8`` and ``--flow-int8`` (docs/performance.md, "CPU fast path")."""
    parser.add_argument("--dtype", choices=DTYPES, default=DEFAULT_DTYPE,
                        help="CosyVoice 2 compute precision: auto (bfloat16 flow + HiFT on CPUs with AMX or AVX-512 "
                        "BF16 and on bf16 GPUs, else float32), float32 (the parity mode) or bfloat16; VoxCPM 2 "
                        "models take float32/bfloat16, auto leaves them their own default (default %(default)s)")
    parser.add_argument("--lm-int8", action="store_true",
                        help="CosyVoice 2 on CPU: the LM's linear layers with int8 weights (int8 x bfloat16 where the CPU has "
                             "AMX / AVX-512 BF16, else dynamic quantization)")
    parser.add_argument("--flow-int8", action="store_true",
                        help="CosyVoice 2 on CPU: the flow in float32 with its estimator's linear layers in int8 "
                             "(dynamic quantization; for CPUs without fast bfloat16, e.g. AVX2 only)")


def precision_arguments(model: str | None, dtype: str | None, lm_int8: bool = False, device: str = "cpu",
                        flow_int8: bool = False) -> dict:
    """The keyword arguments ``cadenza.api.load`` gets for ``--dtype`` / ``--lm-int8`` / ``--flow-int8`` on the model
    folder ``model`` (None: the built-in one). ``auto`` means a CosyVoice 2 model's capability-based choice; other
    families choose by device themselves, so they get no dtype for it (``Family.chooses_precision``). Raises
    ``CadenzaError`` for an int8 flag on a family without int8 layers and the loader's error for a folder that is
    not a model."""
    if dtype is None and not lm_int8 and not flow_int8:
        return {}
    from cadenza.api.loading import FAMILIES, family_of
    from cadenza.builtin import resolve_model_path
    from cadenza.errors import CadenzaError

    family = family_of(resolve_model_path(model))
    for flag, wanted in (("--lm-int8", lm_int8), ("--flow-int8", flow_int8)):
        if wanted and not family.int8:
            takers = " / ".join(f.title for f in FAMILIES if f.int8)
            raise CadenzaError(f"{flag} applies to {takers} models only, not {family.title}")
    if not family.chooses_precision:
        return {} if dtype in (None, "auto") else {"dtype": dtype}
    if lm_int8 or flow_int8:
        from cadenza.engine.precision import Precision

        return {"dtype": Precision.choose(dtype or "auto", device, lm_int8=lm_int8, flow_int8=flow_int8)}
    return {"dtype": dtype}


def add_watermark_arguments(parser: argparse.ArgumentParser) -> None:
    """``--no-watermark`` and ``--watermark-key-file`` (docs/provenance.md)."""
    parser.add_argument("--no-watermark", action="store_true",
                        help="do not mark the output with the provenance watermark (it is on by default)")
    parser.add_argument("--watermark-key-file", default=None, metavar="FILE",
                        help="mark with your own secret key (16-4096 bytes) instead of Cadenza's public one")


def watermark_argument(args: argparse.Namespace) -> dict:
    """The ``watermark=`` keyword ``cadenza.api.load`` gets for those flags (none when they are not given)."""
    from cadenza.errors import CadenzaError

    off, key_file = getattr(args, "no_watermark", False), getattr(args, "watermark_key_file", None)
    if off and key_file:
        raise CadenzaError("--no-watermark and --watermark-key-file contradict each other")
    if off:
        return {"watermark": False}
    if key_file:
        from cadenza.provenance.keys import load_key

        return {"watermark": load_key(key_file)}
    return {}
