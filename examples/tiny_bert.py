"""A tiny random-initialised Hugging Face BERT for `trnc compile FILE.py:NAME`: `bert()` returns the model
and its example inputs (token ids).

Run: trnc compile examples/tiny_bert.py:bert -o bert.trnc && trnc run bert.trnc
"""
import torch
import transformers


def bert(batch: int = 2, seq: int = 32):
    """Two layers of width 64, seeded, in eval mode (dropout off), with sdpa attention; ids in [0, 120)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=120, max_position_embeddings=64,
                                     attn_implementation="sdpa")
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return model, (ids,)
