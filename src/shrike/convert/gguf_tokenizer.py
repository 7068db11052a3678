"""tokenizer.json and tokenizer_config.json rebuilt from a GGUF vocabulary."""

from __future__ import annotations

from gguf import Keys, TokenType
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from shrike.convert.chat_templates import default_chat_template
from shrike.convert.gguf_metadata import GGUFMetadata
from shrike.convert.gguf_sentencepiece import sentencepiece_bpe, sentencepiece_post_processor


def _gpt2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digit_splitting_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # llama.cpp splits these vocabularies with "\p{N}" before the GPT-2 regex: every digit is its own word
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


# tokenizer.ggml.pre names whose llama.cpp regexes have an exact `tokenizers` equivalent
_PRE_TOKENIZERS = {
    "gpt2": _gpt2_pre_tokenizer,
    "smollm": _digit_splitting_pre_tokenizer,
    "starcoder": _digit_splitting_pre_tokenizer,
    "refact": _digit_splitting_pre_tokenizer,
    "codeshell": _digit_splitting_pre_tokenizer,
}


# tokenizer.ggml.model values that convert
SUPPORTED_TOKENIZER_MODELS = "'gpt2' (byte-level BPE) and 'llama' (SentencePiece with byte fallback)"


def tokenizer_json(meta: GGUFMetadata) -> str:
    embedded = meta.get(Keys.Tokenizer.HF_JSON)
    if embedded is not None:
        return embedded
    kind = meta.require(Keys.Tokenizer.MODEL)
    if kind == "gpt2":
        return _byte_level_bpe(meta).to_str(pretty=True)
    if kind == "llama":
        tokenizer = sentencepiece_bpe(meta)
        tokens = meta.require(Keys.Tokenizer.LIST)
        prefix, suffix = _added_special_tokens(meta, tokens)
        if prefix or suffix:
            tokenizer.post_processor = sentencepiece_post_processor(prefix, suffix, tokens)
        return tokenizer.to_str()  # not pretty: a 256k-piece vocabulary has a million merges
    raise ValueError(f"GGUF tokenizer model {kind!r} is not supported; supported: {SUPPORTED_TOKENIZER_MODELS}")


def _byte_level_bpe(meta: GGUFMetadata) -> Tokenizer:
    pre = meta.get(Keys.Tokenizer.PRE, "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted(_PRE_TOKENIZERS))}"
        )
    tokens: list[str] = meta.require(Keys.Tokenizer.LIST)
    token_types: list[int] = meta.get(Keys.Tokenizer.TOKEN_TYPE, [TokenType.NORMAL] * len(tokens))
    merges = [tuple(merge.split(" ")) for merge in meta.require(Keys.Tokenizer.MERGES)]
    if any(len(pair) != 2 for pair in merges):
        raise ValueError("the GGUF BPE merges are malformed: each must be two symbols separated by one space")

    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens([
        AddedToken(tokens[i], special=token_types[i] in (TokenType.CONTROL, TokenType.UNKNOWN), normalized=False)
        for i in range(len(tokens))
        if token_types[i] in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED)
    ])
    tokenizer.post_processor = _post_processor(meta, tokens)
    return tokenizer


def _post_processor(meta: GGUFMetadata, tokens: list[str]) -> processors.PostProcessor:
    byte_level = processors.ByteLevel(trim_offsets=False)
    prefix, suffix = _added_special_tokens(meta, tokens)
    if not prefix and not suffix:
        return byte_level
    special_tokens = [(tokens[token_id], token_id) for token_id in {*prefix, *suffix}]
    before = [tokens[token_id] for token_id in prefix]
    after = [tokens[token_id] for token_id in suffix]
    template = processors.TemplateProcessing(
        single=[*before, "$A", *after],
        pair=[*before, "$A", *after, *before, "$B:1", *[f"{token}:1" for token in after]],
        special_tokens=special_tokens,
    )
    return processors.Sequence([byte_level, template])


def _added_special_tokens(meta: GGUFMetadata, tokens: list[str]) -> tuple[list[int], list[int]]:
    """Token ids that encoding puts before and after the text (llama.cpp's add_bos/add_eos flags)."""
    prefix = [meta.require(Keys.Tokenizer.BOS_ID)] if meta.get(Keys.Tokenizer.ADD_BOS, False) else []
    suffix = [meta.require(Keys.Tokenizer.EOS_ID)] if meta.get(Keys.Tokenizer.ADD_EOS, False) else []
    for token_id in (*prefix, *suffix):
        if not 0 <= token_id < len(tokens):
            raise ValueError(f"the GGUF special token id {token_id} is outside the {len(tokens)}-token vocabulary")
    return prefix, suffix


def tokenizer_config(meta: GGUFMetadata, tokenizer_file_text: str, model_max_length: int) -> dict:
    tokenizer = Tokenizer.from_str(tokenizer_file_text)
    config: dict = {
        # The generic fast tokenizer runs tokenizer.json as written; model-specific classes rebuild their own pipeline
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(meta.get(Keys.Tokenizer.ADD_BOS, False)),
        "add_eos_token": bool(meta.get(Keys.Tokenizer.ADD_EOS, False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "added_tokens_decoder": {
            str(token_id): {
                "content": added.content,
                "lstrip": added.lstrip,
                "normalized": added.normalized,
                "rstrip": added.rstrip,
                "single_word": added.single_word,
                "special": added.special,
            }
            for token_id, added in sorted(tokenizer.get_added_tokens_decoder().items())
        },
    }
    for name, key in (("bos_token", Keys.Tokenizer.BOS_ID), ("eos_token", Keys.Tokenizer.EOS_ID),
                      ("unk_token", Keys.Tokenizer.UNK_ID), ("pad_token", Keys.Tokenizer.PAD_ID)):
        token_id = meta.get(key)
        if token_id is not None:
            config[name] = tokenizer.id_to_token(token_id)
    chat_template = _chat_template(meta)
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config


def _chat_template(meta: GGUFMetadata) -> str | list[dict] | None:
    """The default template, or transformers' list-of-named-templates form when the file has several."""
    # Some GGUF files (e.g. of base models) carry no template; the architecture's own format then serves.
    default = meta.get(Keys.Tokenizer.CHAT_TEMPLATE) or default_chat_template(meta.architecture)
    named_prefix = Keys.Tokenizer.CHAT_TEMPLATE_N.format(name="")
    named = {key.removeprefix(named_prefix): meta.get(key) for key in meta.keys_with_prefix(named_prefix)}
    if not named:
        return default
    if default is not None:
        named = {"default": default, **named}
    return [{"name": name, "template": template} for name, template in named.items()]
