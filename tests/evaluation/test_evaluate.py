"""Evaluation as the paper did it: detokenizer, window arithmetic, LAMBADA targets, `seqwarm eval`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import small_config
from seqwarm.cli import main
from seqwarm.data.tokenizer import ByteTokenizer
from seqwarm.evaluation import (
    check_eval_files,
    count_original_words,
    evaluate_lambada,
    evaluate_wikitext,
    lambada_example,
    load_run,
    read_lambada,
    record_results,
    run_paper_evals,
    wikitext_detokenize,
    wikitext_windows,
)
from seqwarm.util.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (conftest)

BYTE = ByteTokenizer()


# ------------------------------------------------------------------------------------------------
# detokenizer


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("a state @-@ of @-@ the @-@ art design", "a state-of-the-art design"),
        ("it cost 1 @,@ 250 @,@ 000 dollars", "it cost 1,250,000 dollars"),
        ("a 2 @.@ 5 m wall", "a 2.5 m wall"),
        ("first : second ; third", "first: second; third"),
        ("one , two . Three ! Four ? Five", "one, two. Three! Four? Five"),
        ("the end .", "the end."),
        ("the end . \nnext", "the end.\nnext"),
        ("Wait . . . what", "Wait... what"),
        ("the film ( 2004 ) was", "the film (2004) was"),
        ("see [ 1 ] and { x }", "see [1] and {x}"),
        ('he said " hello , world . " and left', 'he said "hello, world." and left'),
        ('" one " and " two "', '"one" and "two"'),
        ("Boulter 's role", "Boulter's role"),
        ("20 \u00b0 C", "20\u00b0C"),
        ("= Robert Boulter =", "= Robert Boulter ="),
        ("= = Career = =", "== Career =="),
        ("= = = 2000 – 2005 = = =", "=== 2000 – 2005 ==="),
        ("= = = = Deep = = = =", "==== Deep ===="),
        ("x = y", "x = y"),
        (" \n = Title = \n \n Text here . \n", "\n= Title =\n\nText here.\n"),
    ],
)
def test_detokenizer_rules(raw, expected):
    assert wikitext_detokenize(raw) == expected


def test_detokenizer_does_not_pair_quotes_across_lines():
    assert wikitext_detokenize('a " b\nc " d') == 'a " b\nc " d'


def test_original_words_split_on_single_spaces_of_the_stripped_raw_text():
    # pieces: "A", "b", ".", "\n", "\n", "C", "", "d"  (bare newlines and the empty piece count)
    assert count_original_words(" A b . \n \n C  d \n") == 8


# ------------------------------------------------------------------------------------------------
# windows


def test_windows_stride_32_by_hand():
    # 101 tokens = 100 targets, length 32: window 0 scores 0..31, then 8 windows of 8 targets each
    # reach 96, and the last window ends at 100 and scores the 4 new targets.
    w = wikitext_windows(101, 32, 8)
    assert w[0] == (0, 32)
    assert w[1:-1] == [(8 * k, 8) for k in range(1, 9)]
    assert w[-1] == (68, 4)
    assert wikitext_windows(101, 32, 32) == [(0, 32), (32, 32), (64, 32), (68, 4)]
    assert wikitext_windows(33, 32, 32) == [(0, 32)]
    assert wikitext_windows(97, 32, 32) == [(0, 32), (32, 32), (64, 32)]  # an exact fit: no tail


@settings(max_examples=200, deadline=None)
@given(length=st.integers(1, 64), extra=st.integers(0, 300), data=st.data())
def test_every_target_is_scored_exactly_once(length, extra, data):
    stride = data.draw(st.integers(1, length))
    num_tokens = length + 1 + extra
    windows = wikitext_windows(num_tokens, length, stride)
    scored = []
    for start, n in windows:
        assert 0 <= start and start + length <= num_tokens - 1  # full length, inside the text
        assert 1 <= n <= stride or (start, n) == (0, length)
        scored += range(start + length - n, start + length)  # target j = token j + 1
    assert scored == list(range(num_tokens - 1))
    assert all(n == stride for _, n in windows[1:-1])


def test_window_input_errors():
    with pytest.raises(UserError, match="has 32 tokens, fewer than one window needs .seq_length \\+ 1 = 33"):
        wikitext_windows(32, 32, 8)
    with pytest.raises(UserError, match="between 1 and"):
        wikitext_windows(100, 32, 33)
    with pytest.raises(UserError, match="between 1 and"):
        wikitext_windows(100, 32, 0)


# ------------------------------------------------------------------------------------------------
# WikiText evaluator on fake models with closed-form answers


class PositionModel:
    """Logits 0 everywhere except token 0, whose logit is the position in the window. Texts never
    contain byte 0, so the NLL at position p is log(e^p + V - 1): it tells which positions scored."""

    vocab = 257

    def __call__(self, input_ids):
        b, t = input_ids.shape
        logits = torch.zeros(b, t, self.vocab)
        logits[:, :, 0] = torch.arange(t, dtype=torch.float32)
        return logits


def f(p: int) -> float:
    return math.log(math.exp(p) + 256)


RAW = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"  # 88 bytes


@pytest.mark.parametrize("stride,batch", [(8, 1), (8, 3), (32, 2), (32, 64)])
def test_wikitext_scores_the_right_positions(stride, batch):
    tokens = BYTE.encode(RAW)
    assert len(tokens) == 88  # 87 targets, length 32
    res = evaluate_wikitext(
        PositionModel(), BYTE, RAW, seq_length=32, overlapping_eval=stride, batch_size=batch, progress=False
    )
    s = lambda lo, hi: sum(f(p) for p in range(lo, hi))  # noqa: E731
    if stride == 8:  # window 0: 0..31; 6 windows of 8 reach 80; the last scores 7 (positions 25..31)
        expected = s(0, 32) + 6 * s(24, 32) + s(25, 32)
    else:  # 0..31, 32..63 (positions 0..31 again), then the tail window scores 23 (positions 9..31)
        expected = 2 * s(0, 32) + s(9, 32)
    assert res["num_scored_tokens"] == 87 == res["num_tokenized_tokens"] - 1
    assert res["loss"] == pytest.approx(expected / 87, rel=1e-6)
    assert res["ppl"] == pytest.approx(math.exp(expected / 87), rel=1e-6)
    words = len(RAW.split(" "))
    assert res["num_original_words"] == words == 15
    assert res["adjusted_ppl"] == pytest.approx(math.exp(expected / (words - 1)), rel=1e-6)
    assert res["num_windows"] == (1 + 6 + 1 if stride == 8 else 3)


class BigramModel:
    """Logits depend only on the current input token: the total NLL does not depend on the windows."""

    def __init__(self, vocab=257, seed=0):
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))

    def __call__(self, input_ids):
        return self.table[input_ids]


@pytest.mark.parametrize("length,stride,batch", [(16, 16, 4), (16, 1, 7), (16, 5, 2), (40, 32, 3)])
def test_wikitext_total_nll_equals_bigram_sum(length, stride, batch):
    model = BigramModel()
    raw = "the quick brown fox , jumps over the lazy dog . " * 5
    ids = torch.tensor(BYTE.encode(wikitext_detokenize(raw)))
    expected = float(torch.nn.functional.cross_entropy(model.table[ids[:-1]], ids[1:], reduction="sum"))
    res = evaluate_wikitext(
        model, BYTE, raw, seq_length=length, overlapping_eval=stride, batch_size=batch, progress=False
    )
    assert res["loss"] * res["num_scored_tokens"] == pytest.approx(expected, rel=1e-5)
    assert res["num_tokenized_tokens"] == len(ids)


def test_wikitext_uniform_model_is_the_vocabulary_size():
    uniform = lambda ids: torch.zeros(*ids.shape, 257)  # noqa: E731
    res = evaluate_wikitext(uniform, BYTE, RAW, seq_length=16, progress=False)
    assert res["ppl"] == pytest.approx(257)
    assert res["adjusted_ppl"] == pytest.approx(math.exp(87 * math.log(257) / 14))


def test_real_gpt_model_mode_is_restored_and_text_too_short_is_refused():
    from seqwarm.trainer.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=257, seq_length=16, n_layer=1, n_head=2, n_embd=16)).train()
    res = evaluate_wikitext(model, BYTE, RAW, overlapping_eval=4, progress=False)  # length from model.config
    assert res["seq_length"] == 16 and model.training and math.isfinite(res["ppl"])
    with pytest.raises(UserError, match="has 10 tokens, fewer than one window needs .seq_length \\+ 1 = 17"):
        evaluate_wikitext(model, BYTE, "short text", progress=False)


# ------------------------------------------------------------------------------------------------
# LAMBADA


def test_lambada_strict_and_non_strict_targets():
    text = "the cat sat on the mat\n"
    strict = lambada_example(text, BYTE)
    assert strict.context == BYTE.encode("the cat sat on the")
    assert strict.target == BYTE.encode(" mat") and len(strict.target) == 4  # a multi-token last word
    loose = lambada_example(text, BYTE, strict=False)
    assert loose.context == BYTE.encode("the cat sat on the ma") and loose.target == [ord("t")]
    with pytest.raises(ValueError, match="two words"):
        lambada_example("lonely", BYTE)


class OracleModel:
    """Predicts the next byte of the known texts (teacher forcing), except at the positions in ``wrong``
    (prefixes whose next byte it gets wrong on purpose)."""

    def __init__(self, texts, wrong=()):
        self.next = {}
        for text in texts:
            ids = BYTE.encode(text.strip())
            for i in range(1, len(ids)):
                self.next[tuple(ids[:i])] = ids[i]
        self.wrong = set(wrong)

    def __call__(self, input_ids):
        b, t = input_ids.shape
        logits = torch.zeros(b, t, 257)
        for r in range(b):
            row = input_ids[r].tolist()
            for p in range(t):
                prefix = tuple(row[: p + 1])
                if prefix in self.next:
                    good = self.next[prefix]
                    logits[r, p, (good + 1) % 256 if prefix in self.wrong else good] = 5.0
        return logits


TEXTS = ["the cat sat on the mat", "a much longer passage ends with a word", "hi there"]


@pytest.mark.parametrize("batch", [1, 2, 8])
def test_lambada_accuracy_strict_vs_non_strict(batch):
    perfect = OracleModel(TEXTS)
    res = evaluate_lambada(perfect, BYTE, TEXTS, seq_length=64, batch_size=batch, progress=False)
    assert (res["accuracy"], res["num_correct"], res["num_examples"]) == (1.0, 3, 3)
    assert res["num_target_tokens"] == len(" mat") + len(" word") + len(" there")
    # wrong on the "m" of " mat" only: strict fails that example, non-strict (last byte "t") still passes
    wrong = [tuple(BYTE.encode("the cat sat on the "))]
    model = OracleModel(TEXTS, wrong)
    strict = evaluate_lambada(model, BYTE, TEXTS, seq_length=64, batch_size=batch, progress=False)
    loose = evaluate_lambada(model, BYTE, TEXTS, strict=False, seq_length=64, batch_size=batch, progress=False)
    assert (strict["num_correct"], strict["accuracy"]) == (2, pytest.approx(2 / 3))
    assert (loose["num_correct"], loose["strict"]) == (3, False)
    # wrong on the last byte only: both modes fail it
    last = [tuple(BYTE.encode("hi ther"))]
    model = OracleModel(TEXTS, last)
    assert evaluate_lambada(model, BYTE, TEXTS, seq_length=64, batch_size=batch, progress=False)["num_correct"] == 2
    assert (
        evaluate_lambada(model, BYTE, TEXTS, strict=False, seq_length=64, batch_size=batch, progress=False)[
            "num_correct"
        ]
        == 2
    )


def test_lambada_long_context_keeps_its_last_tokens():
    seen = []

    def model(ids):
        seen.append(ids.shape[1])
        return torch.zeros(*ids.shape, 257)

    res = evaluate_lambada(model, BYTE, TEXTS, seq_length=8, batch_size=2, progress=False)
    assert max(seen) <= 8 and res["num_examples"] == 3


def test_read_lambada_errors(tmp_path):
    good = tmp_path / "ok.jsonl"
    good.write_text('{"text": "a b c"}\n\n{"text": "d e"}\n')
    assert read_lambada(good) == ["a b c", "d e"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a b"}\n{"body": "x"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: no 'text' string field"):
        read_lambada(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a b"}\nnot json\n')
    with pytest.raises(UserError, match=r"broken.jsonl:2: not a JSON object"):
        read_lambada(broken)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(UserError, match="is empty"):
        read_lambada(empty)
    with pytest.raises(UserError, match="does not exist"):
        read_lambada(tmp_path / "nope.jsonl")


# ------------------------------------------------------------------------------------------------
# seqwarm eval on a real (tiny) run folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, byte_data):
    base = tmp_path_factory.mktemp("evalrun")
    cfg = small_config(base / "c.json", train_tokens=1500)
    out = base / "run"
    code = main(
        [
            "train",
            "--model",
            "tiny",
            "--eval-iters",
            "1",
            "--no-progress",
            "--no-tensorboard",
            "--config",
            str(cfg),
            "--data",
            str(byte_data),
            "--out",
            str(out),
            "--save-interval",
            "2",
            "--eval-interval",
            "0",
        ]
    )
    assert code == 0
    return out


@pytest.fixture(scope="module")
def eval_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("evalfiles")
    words = "the model learns short context first and long context later".split()
    lines = [" = Title = ", ""]
    for i in range(8):
        lines += [" " + " ".join(words[(i + k) % len(words)] for k in range(12)) + " , 2 @,@ 000 ( x ) . ", ""]
    wiki = base / "wiki.test.raw"
    wiki.write_text("\n".join(lines) + "\n")
    lam = base / "lambada_test.jsonl"
    lam.write_text("".join(json.dumps({"text": " ".join(words[i:] + words[:i])}) + "\n" for i in range(5)))
    return wiki, lam


def _steps(run: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run / "checkpoints").glob("step_*.pt"))


def test_cli_json_shape_and_eval_file(run_dir, eval_files, capsys):
    wiki, lam = eval_files
    (run_dir / "eval.json").unlink(missing_ok=True)
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                str(run_dir),
                "--wikitext",
                str(wiki),
                "--lambada",
                str(lam),
                "--val",
                "--val-windows",
                "3",
                "--batch-size",
                "4",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"wikitext", "lambada", "val"}
    assert {"ppl", "adjusted_ppl", "num_tokenized_tokens", "num_original_words", "loss"} <= set(printed["wikitext"])
    assert {"accuracy", "num_examples", "num_correct"} <= set(printed["lambada"])
    assert printed["lambada"]["num_examples"] == 5 and printed["val"]["num_windows"] == 3
    assert printed["wikitext"]["num_original_words"] == count_original_words(wiki.read_text())
    last = _steps(run_dir)[-1]
    saved = json.loads((run_dir / "eval.json").read_text())
    assert list(saved) == [str(last)]
    assert saved[str(last)]["wikitext"] == printed["wikitext"] and saved[str(last)]["tokens"] > 0

    # the CLI numbers are the library's on the loaded checkpoint
    loaded = load_run(run_dir, device="cpu")
    direct = evaluate_wikitext(loaded.model, loaded.tokenizer, wiki.read_text(), progress=False)
    assert direct["loss"] == pytest.approx(printed["wikitext"]["loss"], rel=1e-5)

    # an older checkpoint is added next to it; a second eval of the same step keeps other sections
    first = _steps(run_dir)[0]
    assert (
        main(
            [
                "eval",
                str(run_dir),
                "--checkpoint",
                str(first),
                "--lambada",
                str(lam),
                "--non-strict",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    assert set(json.loads(capsys.readouterr().out)) == {"lambada"}
    assert main(["eval", str(run_dir), "--val", "--val-windows", "2", "--no-progress"]) == 0
    human = capsys.readouterr().out
    assert "val:" in human and "eval.json" in human
    saved = json.loads((run_dir / "eval.json").read_text())
    assert list(saved) == [str(first), str(last)]
    assert saved[str(first)]["lambada"]["strict"] is False
    assert set(saved[str(last)]) >= {"wikitext", "lambada", "val"} and saved[str(last)]["val"]["num_windows"] == 2


def test_run_paper_evals_returns_the_sections(run_dir, eval_files):
    wiki, _ = eval_files
    res = run_paper_evals(run_dir, wikitext=wiki, overlapping_eval=64, device="cpu", progress=False, write=False)
    assert res["step"] == _steps(run_dir)[-1] and res["wikitext"]["overlapping_eval"] == 64
    assert "lambada" not in res


def _bad(args, capsys):
    capsys.readouterr()
    try:
        code = main(["eval", *args, "--no-progress"])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_bad_input_exits_2(run_dir, eval_files, tmp_path, capsys):
    wiki, lam = eval_files
    r = str(run_dir)
    steps = _steps(run_dir)
    cases = [
        ([str(tmp_path / "missing"), "--val"], "does not exist"),
        ([r], "nothing to evaluate"),
        ([r, "--checkpoint", "999", "--val"], f"no checkpoint of step 999; available: {', '.join(map(str, steps))}"),
        ([r, "--wikitext", str(tmp_path / "nope.raw")], "does not exist"),
        ([r, "--overlapping-eval", "0", "--wikitext", str(wiki)], "must be at least 1"),
        ([r, "--overlapping-eval", "65", "--wikitext", str(wiki)], "between 1 and the model's length 64"),
        ([r, "--val-windows", "2"], "only applies with --val"),
    ]
    empty = tmp_path / "empty.raw"
    empty.write_text(" \n \n")
    cases.append(([r, "--wikitext", str(empty)], "is empty"))
    short = tmp_path / "short.raw"
    short.write_text(" a short text . \n")  # detokenized: " a short text.\n", 15 bytes
    cases.append(
        ([r, "--wikitext", str(short)], "the text has 15 tokens, fewer than one window needs (seq_length + 1 = 65)")
    )
    notext = tmp_path / "notext.jsonl"
    notext.write_text('{"text": "a b c"}\n{"txt": "a b c"}\n')
    cases.append(([r, "--lambada", str(notext)], f"{notext}:2: no 'text' string field"))
    no_ckpt = tmp_path / "empty_run"
    no_ckpt.mkdir()
    cases.append(([str(no_ckpt), "--val"], "has no checkpoint"))
    for args, fragment in cases:
        code, err = _bad(args, capsys)
        assert code == 2, (args, err)
        assert fragment in err, (args, err)


def test_eval_file_merges_by_step_in_numeric_order(tmp_path):
    record_results(tmp_path, 16, {"val": {"loss": 1.0}})
    record_results(tmp_path, 8, {"wikitext": {"ppl": 3.0}})
    record_results(tmp_path, 16, {"lambada": {"accuracy": 0.5}})
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert list(saved) == ["8", "16"]
    assert saved["16"] == {"val": {"loss": 1.0}, "lambada": {"accuracy": 0.5}}


def test_broken_eval_file_fails_before_the_work(eval_files, tmp_path, capsys):
    _, lam = eval_files
    run = tmp_path / "run"  # checked before the checkpoint is even looked for
    run.mkdir()
    (run / "eval.json").write_text("{not json")
    code, err = _bad([str(run), "--lambada", str(lam)], capsys)
    assert code == 2 and "eval.json is not valid JSON" in err


def test_check_eval_files_fails_fast(eval_files, tmp_path):
    wiki, lam = eval_files
    check_eval_files(wikitext=wiki, lambada=lam)
    with pytest.raises(UserError, match="does not exist"):
        check_eval_files(wikitext=tmp_path / "missing.raw")


# ------------------------------------------------------------------------------------------------
# full-length validation as training scored it: document masking, HF targets (issue #25)


def test_val_with_document_masking_and_hf_targets(byte_data):
    from seqwarm.data import open_prepared
    from seqwarm.evaluation import evaluate_val
    from seqwarm.trainer.model import GPT, GPTConfig

    data = open_prepared(byte_data)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.vocab_size, seq_length=64, n_layer=1, n_head=2, n_embd=16))
    kw = dict(data=data, progress=False, num_windows=None)
    plain, masked = (evaluate_val(model, document_masking=m, **kw) for m in (False, True))
    windows = plain["num_windows"]
    assert plain["num_tokens"] == masked["num_tokens"] == 64 * windows and masked["document_masking"] is True
    assert plain["loss"] != masked["loss"]  # windows that hold a document boundary attend otherwise
    hf = evaluate_val(model, label_style="hf", **kw)
    assert hf["num_tokens"] == 63 * windows and hf["loss"] != plain["loss"]  # no target after the last input
    with pytest.raises(ValueError, match="takes no document_ids.*CausalLMLoss"):  # HF forwards take **kwargs
        evaluate_val(lambda ids, **kwargs: model(ids), document_masking=True, seq_length=64, **kw)
    with pytest.raises(UserError, match="label_style"):
        evaluate_val(model, label_style="HF", **kw)
