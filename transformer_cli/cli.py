"""The `tcli` command line. Each command loads its config, calls one library function, returns an exit code.

Heavy imports (torch) happen inside the commands so that `tcli --help` is instant.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand


class OptionsOnce(TyperCommand):
    """A command line read as the user wrote it, before the values become paths and numbers:

    - each option is given once: `--beam 4 ... --beam 5` is refused in one line rather than read as 5 (the options
      that take a list, `--set` and `--checkpoints`, repeat);
    - a value ending in `/` names a folder, as the system reads it: `--checkpoint best.pt/` is refused like
      `cat best.pt/` ("Not a directory"), not read as best.pt (a path drops its trailing slash), and so is a new
      file to write (`--output out/`, an option whose metavar is FILE).
    """

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        from transformer_cli.core.errors import DECIMAL, UserError

        values, extra, order = self.make_parser(ctx).parse_args(args=list(args))  # order: each option as given
        seen = set()
        for param in order:
            if param.param_type_name != "option" or getattr(param, "multiple", False) or param.name == "help":
                continue
            if param.name in seen:
                names = " / ".join(param.opts + param.secondary_opts)
                raise UserError(f"{names} is given twice; give each option once ({ctx.command_path} --help)")
            seen.add(param.name)
        options = [param for param in self.params if param.param_type_name == "option"]
        given = [(param.opts[0], values.get(param.name)) for param in options]
        for param in options:  # Python's int() reads 3_0 as 30 and " 5" or "٥" as 5: a number is written plainly
            raw = values.get(param.name)
            if getattr(param, "type_descriptor", None) is None or not isinstance(raw, str):
                continue
            if param.type_descriptor.annotation in (int, float):
                if not (DECIMAL.fullmatch(raw) or re.fullmatch(r"[-+]?(inf|nan)", raw, re.I)):
                    like = "an integer, like 30" if param.type_descriptor.annotation is int else "a number, like 0.6"
                    raise UserError(f"{param.opts[0]} {raw!r}: write {like}, in decimal digits")
        files = {param.opts[0] for param in options if param.metavar == "FILE"}  # a file to write: it may be new
        for option, raw in [*given, ("argument", extra)]:
            for value in raw if isinstance(raw, list | tuple) else [raw]:
                if not (isinstance(value, str) and value.endswith("/")) or os.path.isdir(value):
                    continue
                if option in files or os.path.lexists(value.rstrip("/") or "/"):
                    raise UserError(f"{option} {value!r}: not a directory; a file is named without the final '/'")
        return super().parse_args(ctx, args)


app = typer.Typer(
    name="tcli",
    help="Train Transformer translation models, pretrain BERT and fine-tune it, each from one YAML file.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[ct2]" in `pip install -e ".[ct2]"` is not markup
)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML run configuration")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a key: --set train.lr=0.001 (repeatable)")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="run directory (default runs/<config name>)")]
ResumeOpt = Annotated[str | None, typer.Option("--resume", help="'auto': continue from <out>/checkpoints/last.pt")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar or log lines")]
BleuTokenizeOpt = Annotated[
    str | None,
    typer.Option(
        "--bleu-tokenize",
        help="sacreBLEU tokenizer for BLEU: auto (by the checkpoint's data.tgt_lang), 13a, zh, char, ja-mecab, ... "
        "(default: the checkpoint's eval.bleu_tokenize)",
    ),
]


# What to make smaller when a command runs out of memory: the advice names its own options.
_MEMORY_ADVICE = {
    "translate": "lower --beam (and --nbest) or --max-tokens, or use another device",
    "evaluate": "lower --beam (translation) or give a smaller --input, or use another device",
    "fill_mask": "shorten the input lines, or use another device",
    "embed": "shorten the input lines, or use another device",
}
_TRAINING_MEMORY_ADVICE = "use a smaller model, train.max_tokens / train.batch_size, or another device"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every writer's cleanup runs (exit code 143)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def user_errors(fn):
    """The one place where exceptions meet the user.

    Every path argument is checked first (`files.check_user_path`). A user's mistake (UserError), a full
    disk, a path the file system refuses, or an allocation the machine cannot hold prints one line and exits
    with code 2; Ctrl-C exits with 130 and SIGTERM with 143, after the writers have removed their temporary
    files. Anything else is a bug in tcli: its traceback is shown, with a request to report it, and the exit
    code is 1.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from transformer_cli.core.errors import UserError, one_line
        from transformer_cli.core.files import check_user_paths

        previous = _catch_sigterm()
        try:
            check_user_paths((_option_name(k), v) for k, v in kwargs.items())
            return fn(*args, **kwargs)
        except UserError as e:
            print(f"error: {one_line(str(e))}", file=sys.stderr)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt as e:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None
        except BrokenPipeError:  # `tcli translate ... | head`: the reader left; nothing to report
            sys.stderr.close()
            raise typer.Exit(141) from None
        except OSError as e:
            message = _os_error_message(e)
            if message is None:
                _report_bug()
                raise
            print(f"error: {one_line(message)}", file=sys.stderr)
            raise typer.Exit(2) from None
        except (MemoryError, RuntimeError) as e:
            if isinstance(e, RuntimeError) and not _out_of_memory(e):
                _report_bug()
                raise
            advice = _MEMORY_ADVICE.get(fn.__name__, _TRAINING_MEMORY_ADVICE)
            print(f"error: out of memory: this does not fit on this machine; {advice}", file=sys.stderr)
            raise typer.Exit(2) from None
        except Exception:
            _report_bug()
            raise
        finally:
            _restore_sigterm(previous)

    return wrapper


def _option_name(param: str) -> str:
    return {"run_dir": "RUN_DIR", "checkpoints": "--checkpoints"}.get(param, "--" + param.strip("_").replace("_", "-"))


def _catch_sigterm():
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _restore_sigterm(previous) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _os_error_message(e: OSError) -> str | None:
    """One line for the OS errors a user's path or machine causes (whatever code raised them); None for the
    rest, which are bugs."""
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device{where}; free some space and run the command again"
    if e.errno == errno.ENAMETOOLONG:
        return f"a file name is too long{where}: each name in a path may have at most 255 bytes"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied{where}: {e.strerror}; choose a path you can write to"
    if e.errno in (errno.EISDIR, errno.ENOTDIR):
        return f"{e.strerror}{where}: check the path"
    return None


def _out_of_memory(e: RuntimeError) -> bool:
    text = str(e)
    return "can't allocate memory" in text or "out of memory" in text.lower()


def _report_bug() -> None:
    print(
        "tcli hit an internal error (a bug, not a mistake of yours): please report it with the command and "
        "the traceback below",
        file=sys.stderr,
    )


def _resume_flag(resume: str | None) -> bool:
    from transformer_cli.core.errors import UserError

    if resume is None:
        return False
    if resume != "auto":
        raise UserError(f"--resume {resume!r}: the supported value is 'auto' (continue from <out>/checkpoints/last.pt)")
    return True


def _check_bleu_tokenize(value: str | None) -> None:
    from transformer_cli.config import check_bleu_tokenize
    from transformer_cli.core.errors import UserError

    try:
        if value is not None:
            check_bleu_tokenize(value)
    except ValueError as e:
        raise UserError(f"--bleu-tokenize: {e}") from None


def _run_dir(out: Path | None, config: Path) -> Path:
    return out if out is not None else Path("runs") / config.stem


@app.command(cls=OptionsOnce)
@user_errors
def train(
    config: ConfigOpt,
    set_: SetOpt = None,
    out: OutOpt = None,
    resume: ResumeOpt = None,
    device: DeviceOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Train an encoder-decoder translation model."""
    from transformer_cli.config import TranslationRunConfig, load_config

    # The config and options are checked before torch is imported: a mistake costs well under a second.
    cfg, resume_auto = load_config(TranslationRunConfig, config, set_), _resume_flag(resume)
    from transformer_cli.translation.setup import train_translation

    train_translation(cfg, _run_dir(out, config), device=device, resume=resume_auto, quiet=quiet)


@app.command(cls=OptionsOnce)
@user_errors
def preprocess(
    config: ConfigOpt,
    out: Annotated[
        Path, typer.Option("--out", help="folder to write (then train with --set data.preprocessed=FOLDER)")
    ],
    set_: SetOpt = None,
    force: Annotated[bool, typer.Option("--force", help="replace another preprocessing in --out")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Tokenise a config's data once into memory-mapped arrays (translation or BERT config)."""
    from transformer_cli.config import file_config
    from transformer_cli.train.preprocess import run_preprocess

    cfg = file_config(config, set_)
    if type(cfg).__name__ == "BertRunConfig":
        from transformer_cli.bert.setup import BertSetup as Setup
    else:
        from transformer_cli.translation.setup import TranslationSetup as Setup
    manifest = run_preprocess(Setup(cfg), out, force, quiet)
    if not quiet:
        print(
            f"preprocessed data in {manifest.folder}: train with --set data.preprocessed={manifest.folder}",
            file=sys.stderr,
        )


@app.command(cls=OptionsOnce)
@user_errors
def translate(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="a .pt file written by tcli train")],
    input: Annotated[Path | None, typer.Option("--input", "-i", help="one sentence per line (default stdin)")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="write here (default or -: stdout)")
    ] = None,
    beam: Annotated[int, typer.Option("--beam", min=1, max=256, help="beam size; 1 is greedy")] = 5,
    lenpen: Annotated[float, typer.Option("--lenpen", min=0.0, max=10.0, help="rank by score / length**lenpen")] = 1.0,
    max_len_a: Annotated[
        float, typer.Option("--max-len-a", min=0.0, max=1000.0, help="max length = a * source + b")
    ] = 1.2,
    max_len_b: Annotated[int, typer.Option("--max-len-b", min=1, max=1 << 20, help="see --max-len-a")] = 10,
    nbest: Annotated[
        int, typer.Option("--nbest", min=1, max=256, help="print n hypotheses per line: index, score, text")
    ] = 1,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=16, max=1 << 26, help="source tokens per batch")
    ] = 8000,
    reference: Annotated[Path | None, typer.Option("--reference", help="print sacreBLEU and chrF against it")] = None,
    bleu_tokenize: BleuTokenizeOpt = None,
    device: DeviceOpt = "auto",
    precision: Annotated[str, typer.Option("--precision", help="auto | fp32 | bf16 | fp16")] = "auto",
    stats_json: Annotated[
        Path | None, typer.Option("--stats-json", metavar="FILE", help="write speed statistics as JSON")
    ] = None,
    quiet: QuietOpt = False,
    attention: Annotated[
        Path | None,
        typer.Option("--attention", help="write attention heatmaps (PNG) and weights (.npz) to this folder"),
    ] = None,
    attention_max: Annotated[
        int, typer.Option("--attention-max", min=1, help="--attention: the first N non-empty lines")
    ] = 10,
    print_alignment: Annotated[
        bool, typer.Option("--print-alignment", help="after each translation line, a line of source-target pairs i-j")
    ] = False,
    alignment_layer: Annotated[
        int | None,
        typer.Option(
            "--alignment-layer",
            help="decoder layer for alignments (0-based; negative from the end; default: second-to-last)",
        ),
    ] = None,
    alignment_unit: Annotated[str, typer.Option("--alignment-unit", help="piece | word")] = "piece",
) -> None:
    """Translate a file or stdin with beam search."""
    from transformer_cli.core.errors import UserError
    from transformer_cli.core.streams import is_standard
    from transformer_cli.translation.decode import DecodeOptions
    from transformer_cli.translation.translate import InspectOptions, run_translate

    if nbest > beam:
        raise UserError(f"--nbest {nbest} cannot exceed --beam {beam}")
    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise UserError(f"--precision {precision!r}: expected auto, fp32, bf16 or fp16")
    if alignment_unit not in ("piece", "word"):
        raise UserError(f"--alignment-unit {alignment_unit!r}: expected piece or word")
    if not print_alignment and (alignment_layer is not None or alignment_unit != "piece"):
        raise UserError("--alignment-layer and --alignment-unit shape --print-alignment's lines; add --print-alignment")
    if attention is None and attention_max != 10:
        raise UserError("--attention-max counts the lines --attention FOLDER draws; add --attention")
    if bleu_tokenize is not None and reference is None:
        raise UserError("--bleu-tokenize chooses how BLEU against --reference splits words; add --reference")
    _check_bleu_tokenize(bleu_tokenize)
    opts = DecodeOptions(beam, lenpen, max_len_a, max_len_b, max_tokens, nbest)
    inspect = InspectOptions(attention, attention_max, print_alignment, alignment_layer, alignment_unit)
    output = None if is_standard(output) else output  # `-o -`: standard output, as `-i -` is standard input
    run_translate(
        checkpoint, input, output, opts, reference, device, precision, quiet, stats_json, inspect, bleu_tokenize
    )


@app.command("pretrain-bert", cls=OptionsOnce)
@user_errors
def pretrain_bert(
    config: ConfigOpt,
    set_: SetOpt = None,
    out: OutOpt = None,
    resume: ResumeOpt = None,
    device: DeviceOpt = "auto",
    quiet: QuietOpt = False,
    init_from_hf: Annotated[
        Path | None, typer.Option("--init-from-hf", help="start from a folder written by tcli export-hf")
    ] = None,
) -> None:
    """Pretrain BERT (masked LM + next sentence prediction) on your own text."""
    from transformer_cli.config import BertRunConfig, load_config

    cfg, resume_auto = load_config(BertRunConfig, config, set_), _resume_flag(resume)  # before torch, as in train
    from transformer_cli.bert.setup import pretrain_bert as run

    run(cfg, _run_dir(out, config), device=device, resume=resume_auto, quiet=quiet, init_from_hf=init_from_hf)


@app.command(cls=OptionsOnce)
@user_errors
def finetune(
    config: ConfigOpt,
    set_: SetOpt = None,
    out: OutOpt = None,
    resume: ResumeOpt = None,
    device: DeviceOpt = "auto",
    quiet: QuietOpt = False,
    pad_to_max: Annotated[
        bool, typer.Option("--pad-to-max", help="pad every batch to data.max_seq_len (as run_glue.py; benchmarks)")
    ] = False,
) -> None:
    """Fine-tune a BERT (tcli checkpoint, Hugging Face folder, or none) to classify, score or tag text."""
    from transformer_cli.config import FinetuneRunConfig, load_config
    from transformer_cli.finetune.setup import finetune as run

    overrides = [*(set_ or []), *(["train.pad_to_max=true"] if pad_to_max else [])]
    cfg = load_config(FinetuneRunConfig, config, overrides)
    run(cfg, _run_dir(out, config), device=device, resume=_resume_flag(resume), quiet=quiet)


@app.command(cls=OptionsOnce)
@user_errors
def glue(
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="a tcli BERT checkpoint, a Hugging Face BERT folder, or none")
    ],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="a glue_data/ folder (CoLA/, SST-2/, MNLI/, ...)")],
    tasks: Annotated[
        str | None, typer.Option("--tasks", help="comma-separated, e.g. rte,mrpc (default: every task in --data-dir)")
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, max=100, help="runs per task; the table shows medians")] = 1,
    out: Annotated[Path, typer.Option("--out", help="a run directory per task and seed, glue.json, glue.md")] = Path(
        "runs/glue"
    ),
    set_: SetOpt = None,
    device: DeviceOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Fine-tune on every GLUE task (resumable), then print the table and the GLUE score."""
    from transformer_cli.finetune.glue import run_glue

    summary = run_glue(checkpoint, data_dir, tasks, seeds, out, set_ or [], device, quiet)
    print(summary["table"], end="")
    print(f"GLUE score {100 * summary['score']:.1f} (written to {out / 'glue.json'} and glue.md)")


@app.command(cls=OptionsOnce)
@user_errors
def predict(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="a fine-tuned checkpoint from tcli finetune")],
    input: Annotated[
        Path | None,
        typer.Option("--input", "-i", help=".tsv/.csv/.jsonl (the training columns), .conll, or plain lines (stdin)"),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="write here (default or -: stdout)")
    ] = None,
    device: DeviceOpt = "auto",
    precision: Annotated[str, typer.Option("--precision", help="auto | fp32 | bf16 | fp16")] = "fp32",
) -> None:
    """Label, score or tag text with a fine-tuned model: label and probability, the score, or word-tag lines."""
    from transformer_cli.core.errors import UserError
    from transformer_cli.core.streams import is_standard
    from transformer_cli.finetune.predict import run_predict

    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise UserError(f"--precision {precision!r}: expected auto, fp32, bf16 or fp16")
    output = None if is_standard(output) else output  # `-o -`: standard output, as `-i -` is standard input
    start = time.perf_counter()
    count = run_predict(checkpoint, input, output, device, precision)
    if count == 0:
        source = "standard input" if is_standard(input) else str(input)
        print(f"warning: {source} holds no examples: nothing was predicted", file=sys.stderr)
    else:
        seconds = time.perf_counter() - start
        print(f"predicted {count:,} examples in {seconds:.1f} s (model loading included)", file=sys.stderr)


@app.command("export-hf", cls=OptionsOnce)
@user_errors
def export_hf(
    checkpoint: Annotated[
        Path, typer.Option("--checkpoint", help="a BERT checkpoint (pretrain-bert) or a fine-tuned one (finetune)")
    ],
    out: Annotated[Path, typer.Option("--out", help="folder to write (config.json, model.safetensors, ...)")],
    force: Annotated[
        bool,
        typer.Option("--force", help="write into a non-empty folder, replacing the HF model and tokenizer files there"),
    ] = False,
) -> None:
    """Write a BERT checkpoint as a folder transformers loads (BertForPreTraining, or a fine-tuned model as
    BertForSequenceClassification / BertForTokenClassification with its labels) and a fast tokenizer."""
    from transformer_cli.export.hf import HF_FILES
    from transformer_cli.export.hf import export_hf as run

    folder = run(checkpoint, out, force)
    written = [name for name in HF_FILES if (folder / name).is_file()]  # (--force removed the folder's others first)
    print(f"wrote {folder} ({', '.join(written)})", file=sys.stderr)


@app.command("count-params", cls=OptionsOnce)
@user_errors
def count_params(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="a translation or BERT YAML config")] = None,
    checkpoint: Annotated[
        Path | None, typer.Option("--checkpoint", help="a .pt checkpoint (translation, BERT or fine-tuned)")
    ] = None,
    preset: Annotated[
        str | None, typer.Option("--preset", help="bert-base | bert-large | transformer-base | transformer-big")
    ] = None,
    set_: SetOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="print the numbers as JSON")] = False,
) -> None:
    """Exact parameter counts by component, with the closed-form formula."""
    from transformer_cli.tools.count_params import run_count_params

    run_count_params(config, checkpoint, preset, set_, json_)


@app.command("fill-mask", cls=OptionsOnce)
@user_errors
def fill_mask(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="a BERT checkpoint from tcli pretrain-bert")],
    text: Annotated[str | None, typer.Argument(help="a line with one or more [MASK]s")] = None,
    input: Annotated[
        Path | None, typer.Option("--input", "-i", help="a line with [MASK]s per line (- or none: stdin)")
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", min=1, help="predictions per [MASK]")] = 5,
    json_: Annotated[bool, typer.Option("--json", help="one JSON object per input line")] = False,
    device: DeviceOpt = "auto",
) -> None:
    """The top-k pieces (with probabilities) a BERT checkpoint predicts for every [MASK]."""
    from transformer_cli.bert.fill_mask import run_fill_mask

    run_fill_mask(checkpoint, text, input, top_k, json_, device)


@app.command(cls=OptionsOnce)
@user_errors
def embed(
    checkpoint: Annotated[
        Path,
        typer.Option(
            "--checkpoint", help="a BERT checkpoint (pretrain-bert), a fine-tuned one (its encoder), or an HF folder"
        ),
    ],
    input: Annotated[Path | None, typer.Option("--input", "-i", help="one text per line (- or none: stdin)")] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help=".npz: vectors with their lines and pieces; .npy: vectors"),
    ] = None,
    level: Annotated[str, typer.Option("--level", help="piece | word (mean of its pieces) | sentence")] = "sentence",
    pooling: Annotated[
        str | None, typer.Option("--pooling", help="--level sentence: cls | mean (default mean)")
    ] = None,
    layer: Annotated[
        int | None, typer.Option("--layer", help="0 = embeddings ... L = last block (default); negative from the end")
    ] = None,
    similarity: Annotated[
        str | None, typer.Option("--similarity", help="print the cosine matrix of WORD's vectors across the lines")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="FILE", help="--similarity: draw the matrix as a heatmap (PNG)")
    ] = None,
    neighbours: Annotated[
        int | None, typer.Option("--neighbours", min=1, help="print each line's K nearest lines (sentence vectors)")
    ] = None,
    device: DeviceOpt = "auto",
    precision: Annotated[str, typer.Option("--precision", help="auto | fp32 | bf16 | fp16")] = "fp32",
) -> None:
    """Contextual vectors of text from a BERT: per piece, word or line, from any layer (.npz), a word's similarity
    across lines, or each line's nearest lines."""
    from transformer_cli.bert.embed import Options, run_embed
    from transformer_cli.core.errors import UserError

    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise UserError(f"--precision {precision!r}: expected auto, fp32, bf16 or fp16")
    if pooling is not None and level != "sentence":
        raise UserError(f"--pooling makes one vector of a line: it goes with --level sentence, not --level {level}")
    options = Options(level, pooling or "mean", layer)
    run_embed(checkpoint, input, output, options, similarity, plot, neighbours, device, precision)


@app.command(cls=OptionsOnce)
@user_errors
def evaluate(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="a translation, BERT or fine-tuned checkpoint")],
    split: Annotated[
        str | None,
        typer.Option(
            "--split",
            help="a split of the checkpoint's data: translation "
            "{data.dir}/NAME.{src_lang,tgt_lang}; BERT and fine-tuned: train | valid (GLUE: or its dev split)",
        ),
    ] = None,
    input: Annotated[
        Path | None,
        typer.Option(
            "--input",
            "-i",
            help="source file (translation), text in the training format (BERT), labelled file (fine-tuned)",
        ),
    ] = None,
    reference: Annotated[Path | None, typer.Option("--reference", help="translation: references of --input")] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="--split: read the data from here instead of the config's data.dir"),
    ] = None,
    beam: Annotated[
        int | None, typer.Option("--beam", min=1, max=256, help="1..256; default: the checkpoint's eval.beam")
    ] = None,
    lenpen: Annotated[
        float | None, typer.Option("--lenpen", min=0.0, max=10.0, help="0..10; default: eval.lenpen")
    ] = None,
    bleu_tokenize: BleuTokenizeOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="print the result as one JSON object")] = False,
    device: DeviceOpt = "auto",
    precision: Annotated[
        str | None,
        typer.Option("--precision", help="auto | fp32 | bf16 | fp16 (default: the checkpoint's train.precision)"),
    ] = None,
) -> None:
    """Score a checkpoint: translation loss, perplexity, BLEU, chrF; BERT MLM/NSP metrics; a fine-tuned model's
    task metrics."""
    from transformer_cli.core.errors import UserError
    from transformer_cli.tools.evaluate import run_evaluate

    if precision not in (None, "auto", "fp32", "bf16", "fp16"):
        raise UserError(f"--precision {precision!r}: expected auto, fp32, bf16 or fp16")
    if data_dir is not None and split is None:
        raise UserError("--data-dir says where --split's files are; with --input it has nothing to do (leave it out)")
    _check_bleu_tokenize(bleu_tokenize)
    run_evaluate(checkpoint, split, input, reference, data_dir, beam, lenpen, device, precision, json_, bleu_tokenize)


@app.command(cls=OptionsOnce)
@user_errors
def plot(
    run_dir: Annotated[Path, typer.Argument(help="a run directory (with metrics.jsonl)")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", metavar="FILE", help="PNG to write (default RUN_DIR/curves.png)")
    ] = None,
) -> None:
    """Plot a run's curves (loss, BLEU or MLM accuracy, learning rate, tokens/s) from metrics.jsonl."""
    from transformer_cli.tools.plot import plot_run

    print(f"wrote {plot_run(run_dir, out)}", file=sys.stderr)


@app.command("export-ct2", cls=OptionsOnce)
@user_errors
def export_ct2(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="a translation checkpoint from tcli train")],
    out: Annotated[Path, typer.Option("--out", help="folder to write (model.bin, vocabularies, sentencepiece)")],
    quantization: Annotated[
        str | None,
        typer.Option("--quantization", help="int8 | int8_float32 | bfloat16 | float16 (default: float32 weights)"),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="write into a non-empty folder, replacing the CTranslate2 files there")
    ] = False,
) -> None:
    """Write a translation checkpoint as a CTranslate2 model folder (pip install -e ".[ct2]")."""
    from transformer_cli.export.ct2 import export_ct2 as run

    files = run(checkpoint, out, quantization, force)
    print(f"wrote {out} ({', '.join(files)})", file=sys.stderr)


@app.command(cls=OptionsOnce, context_settings={"allow_extra_args": True})
@user_errors
def average(
    ctx: typer.Context,
    checkpoints: Annotated[
        list[Path] | None,
        typer.Option("--checkpoints", help="checkpoints to average (repeat the option, or list them after it)"),
    ] = None,
    run: Annotated[Path | None, typer.Option("--run", help="a run directory: average its newest step files")] = None,
    last: Annotated[int | None, typer.Option("--last", min=2, help="with --run: how many step_<N>.pt")] = None,
    out: Annotated[
        Path | None, typer.Option("--out", metavar="FILE", help="the averaged checkpoint to write (.pt)")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite --out if it exists")] = False,
) -> None:
    """Average the weights of several checkpoints of one model into a new checkpoint."""
    from transformer_cli.core.errors import UserError
    from transformer_cli.export.average import checkpoints_to_average, write_average

    if ctx.args and checkpoints is None:
        raise UserError(f"unexpected argument {ctx.args[0]!r}; checkpoints go after --checkpoints")
    if out is None:
        raise UserError("--out is required: the file to write the averaged checkpoint to")
    extra = [Path(a) for a in ctx.args]
    paths = checkpoints_to_average(None if checkpoints is None else [*checkpoints, *extra], run, last)
    state = write_average(paths, out, force)
    steps = ", ".join("?" if s is None else str(s) for s in state["tcli"]["averaged"]["steps"])
    print(f"wrote {out}: the mean of {len(paths)} checkpoints (steps {steps})", file=sys.stderr)


def main() -> None:
    """Run the app; a usage mistake (unknown option, bad value) is one line and exit code 2, like every
    other user error, instead of a framed message."""
    from transformer_cli.core.errors import UserError, one_line

    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except UserError as e:  # the command line as written (OptionsOnce): an option twice, a file with a final '/'
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        sys.exit(e.exit_code)
    except Exception as e:  # click's (or typer's own copy of click's) usage errors
        if not (hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int)):
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # `tcli` alone: its help, as `tcli --help` shows it
            print(e.format_message())
            sys.exit(0)
        message, ctx = " ".join(e.format_message().split()), getattr(e, "ctx", None)
        if message:
            where = f"; see {ctx.command_path} --help" if ctx is not None else ""
            print(f"error: {message.rstrip('.') if where else message}{where}", file=sys.stderr)
        sys.exit(e.exit_code)
    _finish_quietly()
    sys.exit(code if isinstance(code, int) else 0)


def _finish_quietly() -> None:
    """The command's work is done and on disk: a Ctrl-C or SIGTERM during the interpreter's shutdown
    (atexit handlers of torch and multiprocessing) would only print a traceback and change nothing."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


if __name__ == "__main__":
    main()
