"""Text in (bertfuse/text.py): a vocab.txt -> int32 ids, mask and segment ids that the
converted model runs on; `bertfuse example` writes a vocab.txt of its vocab size."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertfuse.errors import install_hint
from bertfuse.cli import main
from bertfuse.converter.example_vocab import example_vocab
from bertfuse.errors import BertfuseError
from bertfuse.text import GOOGLE_IDS, WordPiece


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[Path, Path]:
    """`bertfuse example --config tiny` and its conversion: (checkpoint dir, model.onnx)."""
    root = tmp_path_factory.mktemp("text")
    assert main(["example", "--config", "tiny", "-o", str(root / "tiny")]) == 0
    assert main(["convert", str(root / "tiny"), "-o", str(root / "tiny.onnx"),
                 "--batch", "2", "--seq", "16"]) == 0
    return root / "tiny", root / "tiny.onnx"


def _vocab(path: Path, words: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(w + "\n" for w in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words]))
    return path


def _one_error_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    return lines[0]


def test_example_writes_a_vocab_of_its_size(example):
    import json

    ckpt, _ = example
    size = json.loads((ckpt / "bert_config.json").read_text())["vocab_size"]
    tokens = (ckpt / "vocab.txt").read_text().split("\n")[:-1]
    assert len(tokens) == size == len(set(tokens))
    assert {t: tokens.index(t) for t in GOOGLE_IDS} == GOOGLE_IDS
    words = [t for t in tokens if t.isalpha() and len(t) > 1]
    assert len(words) > 300 and all(w == w.lower() for w in words)
    assert any(t.startswith("##") and t[2:].isalpha() for t in tokens)
    # below Google's ids the special tokens come first; below five there is no vocab
    assert example_vocab(50)[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(example_vocab(50)) == 50 and example_vocab(4) == []


def test_text_to_the_converted_model(example):
    import onnxruntime as ort

    ckpt, model = example
    tok = WordPiece(ckpt / "vocab.txt", model=model)
    assert tok.max_length == 128  # the model's position table
    texts = ["The quick brown fox jumps over the lazy dog.", "What is BERT?"]
    batch = tok(texts, pairs=["A dog sleeps.", "A language model for search."])
    for a in (batch.input_ids, batch.input_mask, batch.segment_ids):
        assert a.dtype == np.int32 and a.shape == batch.input_ids.shape
    assert (batch.input_ids[batch.input_mask == 0] == GOOGLE_IDS["[PAD]"]).all()
    assert (batch.input_ids[:, 0] == GOOGLE_IDS["[CLS]"]).all()
    assert (batch.input_ids != GOOGLE_IDS["[UNK]"]).all()  # real text, real word pieces
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    seq, pooled = sess.run(["sequence_output", "pooled_output"], batch.feeds())
    assert seq.shape == (*batch.input_ids.shape, 128) and np.isfinite(seq).all()
    # the padded row gives what it gives alone, unpadded: the mask covers the padding
    short = int(np.argmin(batch.input_mask.sum(1)))
    alone = tok(texts[short], pairs=["A dog sleeps.", "A language model for search."][short])
    assert alone.input_mask.all() and alone.input_ids.shape[1] < batch.input_ids.shape[1]
    (one,) = sess.run(["pooled_output"], alone.feeds())
    assert np.abs(one[0] - pooled[short]).max() < 1e-5


def test_pair_segment_ids(tmp_path):
    tok = WordPiece(_vocab(tmp_path / "vocab.txt", ["what", "is", "bert", "a", "model", "?"]))
    assert tok.tokens("what is bert?", "a model") == \
        ["[CLS]", "what", "is", "bert", "?", "[SEP]", "a", "model", "[SEP]"]
    b = tok(["what is bert?", "bert"], pairs=["a model", "a"])
    assert b.segment_ids.tolist() == [[0, 0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0, 0, 0]]
    assert b.input_mask.tolist()[1] == [1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert tok("bert").segment_ids.tolist() == [[0, 0, 0]]
    assert tok("bert", pad_to=6).input_ids.tolist() == [[2, 6, 3, 0, 0, 0]]
    with pytest.raises(BertfuseError, match="2 texts but 1 pairs"):
        tok(["a", "b"], pairs=["c"])
    with pytest.raises(BertfuseError, match="empty batch"):
        tok([])


def test_truncation(example, tmp_path):
    ckpt, model = example
    long = " ".join(["water"] * 500)
    tok = WordPiece(ckpt / "vocab.txt", model=model)
    assert tok(long).input_ids.shape == (1, 128)  # the model's positions, not 502
    tok = WordPiece(ckpt / "vocab.txt", max_length=10)
    ids = tok(long, pairs="fox fox fox").input_ids[0].tolist()
    sep = GOOGLE_IDS["[SEP]"]
    assert len(ids) == 10 and ids[-1] == sep and ids.count(sep) == 2
    # longest first: the long text gives up its tokens, the short one keeps all of its own
    assert tok.tokens(long, "fox fox fox") == \
        ["[CLS]"] + ["water"] * 4 + ["[SEP]"] + ["fox"] * 3 + ["[SEP]"]
    with pytest.raises(BertfuseError, match="longer than the model's 128 positions"):
        WordPiece(ckpt / "vocab.txt", model=model, max_length=129)
    with pytest.raises(BertfuseError, match="max_length"):
        WordPiece(ckpt / "vocab.txt", max_length=2)


def test_lower_casing(tmp_path):
    uncased = _vocab(tmp_path / "plain" / "vocab.txt", ["hello", "cafe", "##s"])
    tok = WordPiece(uncased)
    assert tok.lower_case and "no upper-case" in tok.lower_case_reason
    assert tok.tokens("HELLO Cafés")[1:-1] == ["hello", "cafe", "##s"]  # accents stripped too
    cased = _vocab(tmp_path / "mixed" / "vocab.txt", ["hello", "Hello"])
    tok = WordPiece(cased)
    assert not tok.lower_case and tok.tokens("Hello hello")[1:-1] == ["Hello", "hello"]
    # Google's checkpoint names say it, whatever the vocab holds
    for name, lower in (("uncased_L-2_H-128_A-2", True), ("multi_cased_L-2_H-128_A-2", False),
                        ("bert-base-cased", False), ("showcased", True)):  # the vocab decides
        vocab = _vocab(tmp_path / name / "vocab.txt", ["hello"])
        assert WordPiece(vocab).lower_case is lower
    # a config's do_lower_case wins over the name, the flag over everything
    (tmp_path / "uncased_L-2_H-128_A-2" / "bert_config.json").write_text(
        '{"vocab_size": 5, "do_lower_case": false}')
    vocab = tmp_path / "uncased_L-2_H-128_A-2" / "vocab.txt"
    assert WordPiece(vocab).lower_case is False
    assert WordPiece(vocab, lower_case=True).lower_case is True
    assert WordPiece(vocab, lower_case=True).tokens("HELLO")[1] == "hello"
    assert WordPiece(vocab).tokens("HELLO")[1] == "[UNK]"


def test_unknown_words(tmp_path):
    tok = WordPiece(_vocab(tmp_path / "vocab.txt", ["hello", "world", "##s"]))
    assert tok.tokens("hello zzz worlds ☃ 日本")[1:-1] == \
        ["hello", "[UNK]", "world", "##s", "[UNK]", "[UNK]", "[UNK]"]
    assert tok("zzz").input_ids.tolist() == [[2, 1, 3]]


def test_ascii_path_is_bert_normalizer(example):
    """ASCII text is normalized in Python (bertfuse's fast path); it must give exactly what
    the tokenizers library's BertNormalizer gives."""
    ckpt, _ = example
    rng = random.Random(0)
    alphabet = [chr(i) for i in range(128)] + ["the ", "Water ", "FOX. ", "dog's "] * 30
    for lower in (True, False):
        tok = WordPiece(ckpt / "vocab.txt", lower_case=lower, max_length=48)
        for _ in range(40):
            a, b = ([''.join(rng.choice(alphabet) for _ in range(rng.randrange(80)))
                     for _ in range(3)] for _ in range(2))
            got = tok(a, pairs=b)
            ref = tok._tok.encode_batch(list(zip(a, b)))  # BertNormalizer in tokenizers
            assert got.input_ids.tolist() == [e.ids for e in ref]
            assert got.segment_ids.tolist() == [e.type_ids for e in ref]
            assert got.input_mask.tolist() == [e.attention_mask for e in ref]
            one, ref = tok(a, pad_to=48), tok._tok.encode_batch(a)  # single texts, pad_to
            pad = [[0] * (48 - len(e.ids)) for e in ref]
            assert one.input_ids.tolist() == [e.ids + p for e, p in zip(ref, pad)]
            assert one.input_mask.tolist() == [e.attention_mask + p for e, p in zip(ref, pad)]
            assert not one.segment_ids.any()


def test_word_cache_is_bounded(tmp_path, monkeypatch):
    """Single ASCII texts are put together from cached word pieces; a full cache starts
    afresh and the answers stay the tokenizer's."""
    import bertfuse.text

    monkeypatch.setattr(bertfuse.text, "_CACHED_WORDS", 3)
    tok = WordPiece(_vocab(tmp_path / "vocab.txt", ["hello", "world", "##s", "a", "b"]),
                    max_length=6)
    texts = ["hello worlds a", "zzz hello, b!", "a a a world b b", "x" * 101 + " a"]
    for _ in range(2):
        got, ref = tok(texts), tok._tok.encode_batch(texts)
        assert got.input_ids.tolist() == [e.ids for e in ref]
        assert got.input_mask.tolist() == [e.attention_mask for e in ref]
    assert 0 < len(tok._pieces) <= 3 and "x" * 101 not in tok._pieces


def test_bad_vocab_is_one_line(tmp_path, capsys, example):
    _, model = example
    bad = tmp_path / "vocab.txt"
    bad.write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(BertfuseError, match=r"missing the special tokens \[CLS\], \[SEP\]"):
        WordPiece(bad)
    line = _one_error_line(capsys, ["tokenize", "--vocab", str(bad), "hello"])
    assert "not a BERT vocab.txt: missing the special tokens [CLS], [SEP]" in line
    bad.write_bytes(b"[PAD]\n\xff\xfe\n")
    assert "not UTF-8" in _one_error_line(capsys, ["tokenize", "--vocab", str(bad), "x"])
    assert "not found" in _one_error_line(
        capsys, ["tokenize", "--vocab", str(tmp_path / "none.txt"), "x"])
    big = _vocab(tmp_path / "big" / "vocab.txt", [f"w{i}" for i in range(1200)])
    assert "embedding table has 1000 rows" in _one_error_line(
        capsys, ["tokenize", "--vocab", str(big), "--model", str(model), "x"])


def test_cli_tokenize(example, capsys):
    import json

    ckpt, model = example
    rc = main(["tokenize", "--vocab", str(ckpt / "vocab.txt"), "--model", str(model), "--json",
               "Hello world", "the fox", "--pair", "a b", "--pair", "c"])
    out = json.loads(capsys.readouterr().out)
    want = WordPiece(ckpt / "vocab.txt", model=model)(["Hello world", "the fox"],
                                                      pairs=["a b", "c"])
    assert rc == 0 and out["input_ids"] == want.input_ids.tolist()
    assert out["segment_ids"] == want.segment_ids.tolist() and out["lower_case"] is True


def test_import_bertfuse_does_not_load_tokenizers():
    code = ("import sys, bertfuse, bertfuse.cli, bertfuse.text; "
            "assert 'tokenizers' not in sys.modules, 'tokenizers imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_missing_tokenizers_is_exit_2_with_the_install_hint(example):
    ckpt, _ = example
    code = ("import sys\nsys.modules['tokenizers'] = None\nfrom bertfuse.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "tokenize", "--vocab",
                           str(ckpt / "vocab.txt"), "hello"], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert install_hint("text") in lines[0]


def _tokenizer_json(path: Path, vocab: dict, lowercase: bool = True, kind: str = "WordPiece"):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    model = models.WordPiece(vocab, unk_token="[UNK]") if kind == "WordPiece" else \
        models.BPE({"a": 0, "b": 1}, [])
    tok = Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def test_tokenizer_json_gives_the_same_ids_as_vocab_txt(example, tmp_path):
    """A Hugging Face folder ships tokenizer.json: its WordPiece vocab and lower-casing."""
    from bertfuse.text import read_vocab

    ckpt, model = example
    vocab = read_vocab(ckpt / "vocab.txt")
    hf = tmp_path / "hf"
    _tokenizer_json(hf / "tokenizer.json", vocab, lowercase=True)
    texts, pairs = ["What is BERT?", "Ünïcode and ascii"], ["a language model", "x"]
    want = WordPiece(ckpt / "vocab.txt", model=model, lower_case=True)(texts, pairs)
    for given in (hf / "tokenizer.json", hf):  # the file, or the folder that holds it
        tok = WordPiece(given, model=model)
        assert tok.lower_case and tok.lower_case_reason == "do_lower_case in the config"
        got = tok(texts, pairs)
        np.testing.assert_array_equal(got.input_ids, want.input_ids)
        np.testing.assert_array_equal(got.segment_ids, want.segment_ids)
    cased = _tokenizer_json(tmp_path / "cased" / "tokenizer.json", vocab, lowercase=False)
    assert WordPiece(cased).lower_case is False


def test_non_wordpiece_tokenizer_json_is_one_line(tmp_path, capsys):
    bpe = _tokenizer_json(tmp_path / "roberta" / "tokenizer.json", {}, kind="BPE")
    line = _one_error_line(capsys, ["tokenize", "--vocab", str(bpe), "hello"])
    assert "a BPE tokenizer" in line
    (tmp_path / "empty").mkdir()
    line = _one_error_line(capsys, ["tokenize", "--vocab", str(tmp_path / "empty"), "hello"])
    assert "neither vocab.txt nor tokenizer.json" in line
