"""Hand-computed `LayerCost` lists of reference models (MLP, CNN, transformer, BERT-base).

Used by the placement benchmark and tests; not shipped with cerebras_tf (compiled models get
their layer costs from the compiler).  Conventions, per training sample:

* matmul ``[t, k] x [k, n]``: forward ``2 t k n`` FLOPs, backward ``4 t k n`` (input and
  weight gradients); convolutions the same with ``t = Ho * Wo`` and ``k = Cin * kh * kw``.
* elementwise ops (bias, activation, residual, softmax, layer norm): a few FLOPs per
  element (constants below), backward twice the forward.
* Adam update: 10 FLOPs per parameter per step, amortised over the batch.
* Weights float32 (4 B/param); optimizer state = two Adam slots + a gradient
  accumulator (12 B/param); activations stashed for backward in float16 (2 B).
* A sample streams through a layer as rows: its tokens, the rows of its feature map,
  one row for a flat vector (``LayerCost.stream_rows``).
"""
from __future__ import annotations

from cerebras_tf.wse.placement import LayerCost

__all__ = ["mlp", "cnn", "transformer", "bert_base", "REFERENCE_MODELS", "dense"]

HALF = 2
WEIGHT_BYTES_PER_PARAM = 4
ADAM_STATE_BYTES_PER_PARAM = 12
ADAM_FLOPS_PER_PARAM = 10
LAYER_NORM_FLOPS = 8
SOFTMAX_FLOPS = 5
GELU_FLOPS = 8


def dense(name: str, tokens: int, k: int, n: int, *, batch: int, bias: bool = True, extra_fwd: float = 0.0,
          extra_stash_elems: float = 0.0, out_elems: float | None = None, rows: int | None = None) -> LayerCost:
    """A matmul layer [tokens, k] x [k, n] (+ bias and `extra_fwd` elementwise FLOPs); a sample streams as
    `rows` rows (default: its tokens)."""
    params = k * n + (n if bias else 0)
    fwd = 2.0 * tokens * k * n + (tokens * n if bias else 0) + extra_fwd
    return LayerCost(
        name=name,
        flops_fwd=fwd,
        flops_bwd=2.0 * fwd,
        flops_update=ADAM_FLOPS_PER_PARAM * params / batch,
        weight_bytes=WEIGHT_BYTES_PER_PARAM * params,
        optimizer_state_bytes=ADAM_STATE_BYTES_PER_PARAM * params,
        activation_bytes=HALF * (tokens * k + extra_stash_elems),
        output_bytes=HALF * (tokens * n if out_elems is None else out_elems),
        stream_rows=tokens if rows is None else rows,
    )


def mlp(widths: tuple[int, ...] = (784, 4096, 4096, 4096, 10), batch: int = 256) -> list[LayerCost]:
    """Fully connected network with ReLU between layers and a softmax cross-entropy loss."""
    layers = []
    for i, (k, n) in enumerate(zip(widths, widths[1:])):
        last = i == len(widths) - 2
        layers.append(dense(f"dense_{i}", 1, k, n, batch=batch,
                            extra_fwd=(SOFTMAX_FLOPS + 2) * n if last else n))
    return layers


def _conv(name: str, hw: int, cin: int, cout: int, kernel: int, stride: int, batch: int) -> tuple[LayerCost, int]:
    out_hw = hw // stride
    layer = dense(name, out_hw * out_hw, cin * kernel * kernel, cout, batch=batch, bias=False,
                  extra_fwd=4.0 * out_hw * out_hw * cout,  # batch norm + ReLU
                  extra_stash_elems=hw * hw * cin - out_hw * out_hw * cin * kernel * kernel,
                  out_elems=out_hw * out_hw * cout, rows=out_hw)
    return layer, out_hw


def cnn(image: int = 224, batch: int = 256) -> list[LayerCost]:
    """ResNet-50-like CNN: 7x7 stem, bottleneck stages [3, 4, 6, 3], global pool, 1000-way classifier.

    Each conv is one layer (conv + batch norm + ReLU); the stash is the conv's input
    feature map (not the im2col buffer).
    """
    layers = []
    stem, hw = _conv("stem_conv7x7", image, 3, 64, 7, 2, batch)
    layers.append(stem)
    hw //= 2  # max pool
    cin = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            prefix = f"s{stage + 1}b{block + 1}"
            a, _ = _conv(f"{prefix}_1x1a", hw, cin, width, 1, 1, batch)
            b, out_hw = _conv(f"{prefix}_3x3", hw, width, width, 3, stride, batch)
            c, _ = _conv(f"{prefix}_1x1b", out_hw, width, 4 * width, 1, 1, batch)
            layers += [a, b, c]
            hw, cin = out_hw, 4 * width
    layers.append(dense("pool_fc_loss", 1, cin, 1000, batch=batch, extra_fwd=hw * hw * cin + 7 * 1000,
                        extra_stash_elems=0))  # one pooled vector per sample
    return layers


def _encoder_block(prefix: str, seq: int, hidden: int, heads: int, ffn: int, batch: int) -> list[LayerCost]:
    """One post-LN transformer block as five layers (QKV, attention core, out-proj+LN, FFN up, FFN down+LN)."""
    t = seq
    attn_fwd = 2.0 * 2 * t * t * hidden + SOFTMAX_FLOPS * heads * t * t
    return [
        dense(f"{prefix}_qkv", t, hidden, 3 * hidden, batch=batch),
        LayerCost(name=f"{prefix}_attention", flops_fwd=attn_fwd, flops_bwd=2.0 * attn_fwd,
                  activation_bytes=HALF * (3 * t * hidden + heads * t * t), output_bytes=HALF * t * hidden,
                  stream_rows=t),
        dense(f"{prefix}_attn_out_ln", t, hidden, hidden, batch=batch, extra_fwd=(1 + LAYER_NORM_FLOPS) * t * hidden,
              extra_stash_elems=t * hidden),
        dense(f"{prefix}_ffn_up_gelu", t, hidden, ffn, batch=batch, extra_fwd=GELU_FLOPS * t * ffn,
              extra_stash_elems=t * ffn),
        dense(f"{prefix}_ffn_down_ln", t, ffn, hidden, batch=batch, extra_fwd=(1 + LAYER_NORM_FLOPS) * t * hidden,
              extra_stash_elems=t * hidden),
    ]


def _embedding(name: str, seq: int, hidden: int, vocab: int, positions: int, types: int,
               batch: int) -> LayerCost:
    params = (vocab + positions + types) * hidden + 2 * hidden
    fwd = (3 + LAYER_NORM_FLOPS) * seq * hidden
    return LayerCost(name=name, flops_fwd=fwd, flops_bwd=2.0 * fwd,
                     flops_update=ADAM_FLOPS_PER_PARAM * params / batch,
                     weight_bytes=WEIGHT_BYTES_PER_PARAM * params,
                     optimizer_state_bytes=ADAM_STATE_BYTES_PER_PARAM * params,
                     activation_bytes=HALF * seq * hidden + 4 * seq, output_bytes=HALF * seq * hidden,
                     stream_rows=seq)


def transformer(layers: int = 12, seq: int = 512, hidden: int = 768, heads: int = 12, vocab: int = 50257,
                batch: int = 64) -> list[LayerCost]:
    """GPT-2-small-like decoder language model (tied LM head over every position)."""
    out = [_embedding("embeddings", seq, hidden, vocab, seq, 0, batch)]
    for i in range(layers):
        out += _encoder_block(f"block{i}", seq, hidden, heads, 4 * hidden, batch)
    head = dense("lm_head_loss", seq, hidden, vocab, batch=batch, bias=False,
                 extra_fwd=(SOFTMAX_FLOPS + 2) * seq * vocab, out_elems=0)
    # The LM head's weights are the (tied) embeddings: no separate weights or optimizer state.
    out.append(LayerCost(name=head.name, flops_fwd=head.flops_fwd, flops_bwd=head.flops_bwd,
                         activation_bytes=head.activation_bytes, output_bytes=0.0, stream_rows=seq))
    return out


def bert_base(seq: int = 128, masked: int = 20, batch: int = 256) -> list[LayerCost]:
    """BERT-base pre-training: embeddings, 12 encoder blocks (5 layers each), MLM + NSP heads with loss."""
    hidden, heads, ffn, vocab = 768, 12, 3072, 30522
    out = [_embedding("embeddings", seq, hidden, vocab, 512, 2, batch)]
    for i in range(12):
        out += _encoder_block(f"encoder{i}", seq, hidden, heads, ffn, batch)
    out.append(dense("mlm_transform_ln", masked, hidden, hidden, batch=batch,
                     extra_fwd=(GELU_FLOPS + LAYER_NORM_FLOPS) * masked * hidden))
    # Decoder to the vocabulary reuses the word embeddings (tied); only its bias is new.
    decoder = dense("mlm_decoder_nsp_loss", masked, hidden, vocab, batch=batch,
                    extra_fwd=(SOFTMAX_FLOPS + 2) * masked * vocab + 2 * 2 * hidden * hidden, out_elems=0)
    out.append(LayerCost(name=decoder.name, flops_fwd=decoder.flops_fwd, flops_bwd=decoder.flops_bwd,
                         flops_update=ADAM_FLOPS_PER_PARAM * (vocab + hidden * hidden) / batch,
                         weight_bytes=WEIGHT_BYTES_PER_PARAM * (vocab + hidden * hidden),
                         optimizer_state_bytes=ADAM_STATE_BYTES_PER_PARAM * (vocab + hidden * hidden),
                         activation_bytes=decoder.activation_bytes, output_bytes=0.0, stream_rows=masked))
    return out


# name -> (layer list builder, input bytes per sample streamed from the host)
REFERENCE_MODELS = {
    "MLP": (mlp, 784 * 4 + 4),                    # float32 pixels + int32 label
    "CNN (ResNet-50-like)": (cnn, 224 * 224 * 3 + 4),  # uint8 image + int32 label
    "transformer (GPT-2-small-like)": (transformer, 512 * 4 * 2),  # int32 tokens + targets
    "BERT-base": (bert_base, 128 * 4 * 3 + 20 * 4 * 2 + 4),  # ids, mask, segments, MLM positions/labels, NSP
}
