"""A SentencePiece vocabulary (llama.cpp's tokenizer model 'llama': Llama 2, Mistral, Gemma) as a
`tokenizers` BPE with byte fallback.

SentencePiece BPE merges, at every step, the adjacent pair whose joined piece has the highest
score. A `tokenizers` BPE merges the pair with the lowest rank, so the merges are every split of
every piece into two pieces of the vocabulary, ranked by the joined piece's score. Characters no
piece covers become their UTF-8 bytes (<0xNN> tokens). Spaces are written as U+2581.
"""

from __future__ import annotations

from gguf import Keys, TokenType
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from shrike.convert.gguf_metadata import GGUFMetadata

SPACE = "\u2581"  # SentencePiece's visible space


def sentencepiece_bpe(meta: GGUFMetadata) -> Tokenizer:
    tokens: list[str] = meta.require(Keys.Tokenizer.LIST)
    scores: list[float] = meta.require(Keys.Tokenizer.SCORES)
    token_types: list[int] = meta.get(Keys.Tokenizer.TOKEN_TYPE, [TokenType.NORMAL] * len(tokens))
    if len(scores) != len(tokens) or len(token_types) != len(tokens):
        raise ValueError("the GGUF vocabulary is malformed: tokens, scores and token types differ in length")
    unk_id = meta.get(Keys.Tokenizer.UNK_ID)
    vocab = {token: i for i, token in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=_merges_by_score(tokens, scores, token_types, vocab),
                       unk_token=tokens[unk_id] if unk_id is not None else None, fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(model)
    # llama.cpp's default for SentencePiece vocabularies is a leading space (Llama 2); Gemma turns it off.
    space_prefix = bool(meta.get(Keys.Tokenizer.ADD_PREFIX, True))
    replace = normalizers.Replace(" ", SPACE)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), replace]) if space_prefix else replace
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if space_prefix else []))
    # Control and user-defined pieces match the raw text before SentencePiece sees it, as in llama.cpp.
    tokenizer.add_tokens([
        AddedToken(tokens[i], special=token_types[i] != TokenType.USER_DEFINED, normalized=False)
        for i in range(len(tokens))
        if token_types[i] in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED)
    ])
    return tokenizer


def _merges_by_score(tokens: list[str], scores: list[float], token_types: list[int],
                     vocab: dict[str, int]) -> list[tuple[str, str]]:
    ranked: list[tuple[float, int, str, str]] = []
    for token_id, (piece, kind) in enumerate(zip(tokens, token_types)):
        if kind != TokenType.NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[token_id], token_id, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def sentencepiece_post_processor(prefix: list[int], suffix: list[int], tokens: list[str]) -> processors.PostProcessor:
    """BOS/EOS added around the text as the GGUF's add_bos/add_eos flags ask."""
    special_tokens = [(tokens[token_id], token_id) for token_id in {*prefix, *suffix}]
    before = [tokens[token_id] for token_id in prefix]
    after = [tokens[token_id] for token_id in suffix]
    return processors.TemplateProcessing(
        single=[*before, "$A", *after],
        pair=[*before, "$A", *after, *before, "$B:1", *[f"{token}:1" for token in after]],
        special_tokens=special_tokens,
    )
