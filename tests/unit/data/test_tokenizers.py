"""A Hugging Face `tokenizers` tokenizer trained here, read from beside the shards: the stream's
windows decode back to the documents, documents end with the file's end-of-text id, a character
split across two text pieces survives, and every way to name a bad tokenizer is refused with
what to do — in the spec rule, in `validate`'s dataset check and in the loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainyard.config.loader import load_spec_file
from trainyard.config.problems import Code
from trainyard.config.rules import check_spec
from trainyard.config.settings import Settings
from trainyard.plugins.data.cache import ShardCache
from trainyard.plugins.data.documents import (
    END,
    ByteTokenizer,
    FileTokenizer,
    load_tokenizer,
    token_pieces,
)
from trainyard.plugins.data.reader import StreamingReader
from trainyard.plugins.storage.store import ObjectStore, open_store
from trainyard.plugins.validation.dataset import check_dataset

DEMO = load_spec_file(Path(__file__).resolve().parents[3] / "config" / "jobs" / "demo-tiny-lm.yaml")
DOCS = [f"document {i}: the quick brown fox jumps over the lazy dog, {i} times — naïve café"
        for i in range(40)]


def trained_tokenizer(vocab: int = 300, special: str = "<|endoftext|>") -> bytes:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["[UNK]", special],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(DOCS, trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    return tok.to_str().encode()


@pytest.fixture
def dataset(tmp_path: Path) -> ObjectStore:
    store = open_store((tmp_path / "data").as_uri())
    store.put_bytes("shard-0.jsonl", "".join(json.dumps({"text": d}) + "\n" for d in DOCS).encode())
    store.put_bytes("tokenizer.json", trained_tokenizer())
    return store


def _job(tokenizer: str, vocab: int = 512, source: str = "datasets/demo/"):
    hints = DEMO.spec.parallelism.hints
    assert hints is not None
    dataset = DEMO.spec.dataset.model_copy(update={"tokenizer": tokenizer, "source": source})
    parallelism = DEMO.spec.parallelism.model_copy(update={"hints": hints.model_copy(update={"vocab_size": vocab})})
    return DEMO.model_copy(update={"spec": DEMO.spec.model_copy(update={"dataset": dataset,
                                                                         "parallelism": parallelism})})


def test_windows_decode_back_to_the_documents(dataset: ObjectStore, tmp_path: Path) -> None:
    tokenizer = load_tokenizer("tokenizer.json", dataset)
    assert isinstance(tokenizer, FileTokenizer) and tokenizer.end_of_text == "<|endoftext|>"
    assert tokenizer.name.startswith(dataset.uri.rstrip("/") + "/tokenizer.json@sha256:")
    reader = StreamingReader(dataset, "jsonl", cache=ShardCache(tmp_path / "c", 1 << 20), seq_len=16,
                             batch_size=1, dp_rank=0, dp_size=1, seed=0, shuffle_block=1,
                             tokenizer=tokenizer, tokenizer_name=tokenizer.name)
    windows = []
    while reader.position.epoch == 0:
        windows.append(reader.next_batch().samples[0])
    reader.close()
    assert windows[0].dtype == np.int32 and max(int(w.max()) for w in windows) < tokenizer.vocab_size
    ids = np.concatenate([windows[0]] + [w[1:] for w in windows[1:-1]])  # consecutive windows overlap by one
    texts = [tokenizer._tokenizer.decode(list(map(int, part))) for part in
             np.split(ids, np.flatnonzero(ids == tokenizer.end_of_document) + 1)]
    assert texts[:-1] == DOCS[:len(texts) - 1] and len(texts) > 30  # the tail is cut mid-document


def test_a_character_split_between_two_pieces_is_decoded_whole() -> None:
    tokenizer = FileTokenizer(trained_tokenizer(), "t.json")
    text = "naïve café".encode()
    cut = text.index("ï".encode()) + 1  # inside the two bytes of ï
    split = tokenizer.encode_pieces([text[:cut], text[cut:], END])
    whole = tokenizer.encode_pieces([text, END])
    decode = tokenizer._tokenizer.decode
    assert decode(list(map(int, split[:-1]))) == decode(list(map(int, whole[:-1]))) == "naïve café"
    assert split[-1] == whole[-1] == tokenizer.end_of_document


def test_the_byte_tokenizer_pieces_are_the_bytes_with_zero_after_each_document(tmp_path: Path) -> None:
    import io

    raw = io.BytesIO(b'{"text": "ab"}\n\n{"text": "c"}\n')
    (ids,) = token_pieces(raw, "s.jsonl", "jsonl", ByteTokenizer())
    assert ids.tobytes() == b"ab\x00c\x00"


def test_bad_tokenizers_are_refused_with_what_to_do(dataset: ObjectStore) -> None:
    with pytest.raises(ValueError, match=r"expected .bytes. or a `tokenizer\.json`"):
        load_tokenizer("gpt2")
    with pytest.raises(ValueError, match=r"not in the dataset .* upload it beside the shards"):
        load_tokenizer("other.json", dataset)
    dataset.put_bytes("broken.json", b"{not json")
    with pytest.raises(ValueError, match=r"broken\.json: not a tokenizers `tokenizer\.json`"):
        load_tokenizer("broken.json", dataset)
    dataset.put_bytes("no-end.json", trained_tokenizer(special="<pad>"))
    with pytest.raises(ValueError, match="none of the end-of-text tokens"):
        load_tokenizer("no-end.json", dataset)


@pytest.mark.parametrize("name", ["../other-job/tokenizer.json", "/etc/tok.json", "s3://b/t.json",
                                  "tokenizer.txt", "a//t.json"])
def test_the_spec_rule_keeps_the_tokenizer_inside_the_dataset(name: str) -> None:
    (problem,) = [p for p in check_spec(_job(name)) if p.code == Code.TOKENIZER]
    assert problem.path == "spec.dataset.tokenizer" and "tokenizer.json" in (problem.hint or "")
    assert not [p for p in check_spec(_job("tok/llama.json")) if p.code == Code.TOKENIZER]


def test_a_byte_level_model_needs_256_ids() -> None:
    (problem,) = [p for p in check_spec(_job("bytes", vocab=200)) if p.code == Code.TOKENIZER]
    assert problem.path == "spec.parallelism.hints.vocabSize" and "256" in problem.message


def test_validate_compares_the_files_vocabulary_with_the_model(dataset: ObjectStore, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", object_store=(tmp_path / "objects").as_uri())
    source = dataset.uri
    assert check_dataset(_job("tokenizer.json", vocab=512, source=source), settings) == []
    (small,) = check_dataset(_job("tokenizer.json", vocab=100, source=source), settings)
    assert small.code == Code.TOKENIZER and "at least 300" in (small.hint or "")
    (missing,) = check_dataset(_job("nope.json", source=source), settings)
    assert missing.code == Code.TOKENIZER and missing.path == "spec.dataset.tokenizer"
