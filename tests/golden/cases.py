"""The golden corpus: nmmc command lines whose emitted kernels are stored byte for byte.

Each case is a name (the stored file is ``kernels/<name>.py``) and the arguments of an ``nmmc emit``
or ``nmmc tune`` run that prints the kernel to stdout. ``tests/test_golden.py`` reruns every case
and compares; ``scripts/update_golden.py --update`` rewrites the stored files (only for an intended
change to emitted code, named in the commit).
"""

from __future__ import annotations

PRESETS = ("aws-tiled", "aws-hoist-load", "aws-block-free", "aws-fully-optimized")
DIALECTS = ("nki", "neuronxcc")
GRAPHS = ("lora", "svd_mlp", "three_factor_chain")
MLP = ("--mlp", "--tokens", "128", "--hidden", "2048", "--intermediate", "8192")


def _cases() -> dict[str, tuple[str, ...]]:
    cases: dict[str, tuple[str, ...]] = {}

    def on_target(args: tuple[str, ...]) -> tuple[str, ...]:
        # a case naming no target is a trn1 kernel (the corpus predates trn2 as the default target)
        return args if "--target" in args else (*args, "--target", "trn1")

    def emit(name: str, *args: str) -> None:
        cases[name] = ("emit", *on_target(args), "-o", "-")

    def tune(name: str, *args: str) -> None:
        cases[name] = ("tune", *on_target(args), "--seed", "0", "--no-cache", "--no-progress", "-o", "-")

    # every preset, both dialects (trn1); every preset on trn2 and trn3 (on their default logical core, LNC=2)
    for preset in PRESETS:
        for dialect in DIALECTS:
            emit(f"gemm-1024x2048x1024-{preset}-{dialect}-trn1", "--shape", "1024x2048x1024", "--schedule", preset,
                 "--dialect", dialect)
        for target in ("trn2", "trn3"):
            emit(f"gemm-2048x2048x2048-{preset}-nki-{target}", "--shape", "2048x2048x2048", "--schedule", preset,
                 "--target", target)
    # ragged, fp32, A stored transposed, parameter overrides
    for dialect in DIALECTS:
        emit(f"gemm-ragged-3000x5000x700-{dialect}", "--shape", "3000x5000x700", "--dialect", dialect)
        emit(f"gemm-km-1024x1024x512-{dialect}", "--shape", "1024x1024x512", "--a-layout", "km",
             "--dialect", dialect)
        emit(f"gemm-block-free-k2-mnk-{dialect}", "--shape", "1024x2048x1024", "--schedule", "aws-block-free",
             "--param", "tiles_in_block_k=2", "--param", "loop_order=mnk", "--dialect", dialect)
        emit(f"gemm-pe-transpose-psum-{dialect}", "--shape", "640x1536x384", "--param", "a_transpose=pe",
             "--param", "accumulate=psum", "--param", "loop_order=kmn", "--dialect", dialect)
        emit(f"gemm-psum-buffers-2-{dialect}", "--shape", "700x1500x300", "--param", "tiles_in_block_m=2",
             "--param", "psum_buffers=2", "--dialect", dialect, "--target", "trn2")
        emit(f"gemm-operand-buffers-2-{dialect}", "--shape", "700x1500x1300", "--param", "tiles_in_block_m=2",
             "--param", "tiles_in_block_n=1", "--param", "tiles_in_block_k=4", "--param", "operand_buffers=2",
             "--dialect", dialect, "--target", "trn2")
    emit("gemm-fp32-2000x3000x1000", "--shape", "2000x3000x1000", "--dtype", "fp32")
    emit("gemm-ragged-tiles-200x700x300-trn3", "--shape", "200x700x300", "--param", "tile_m=64",
         "--param", "tile_n=256", "--param", "dma=tile", "--target", "trn3")
    # decode GEMMs
    for tokens in ("1", "32"):
        for dialect in DIALECTS:
            emit(f"gemm-decode-{tokens}x4096x4096-{dialect}", "--shape", f"{tokens}x4096x4096", "--dialect", dialect)
    emit("gemm-decode-1x4096x4096-trn2", "--shape", "1x4096x4096", "--target", "trn2")
    # SVD chains
    for dialect in DIALECTS:
        emit(f"chain-512x8192x2048-keep0.8-{dialect}", "--shape", "512x8192x2048", "--keep-ratio", "0.8",
             "--dialect", dialect)
        emit(f"chain-pe-cacheall-{dialect}", "--shape", "256x4096x2048", "--rank", "512", "--param",
             "x_transpose=pe", "--param", "cache_weights=all", "--dialect", dialect)
    emit("chain-km-512x4096x1024-rank256", "--shape", "512x4096x1024", "--rank", "256", "--a-layout", "km")
    emit("chain-decode-1x4096x4096-rank512", "--shape", "1x4096x4096", "--rank", "512")
    emit("chain-ragged-77x1000x600-rank256", "--shape", "77x1000x600", "--rank", "256")
    for target in ("trn2", "trn3"):
        emit(f"chain-1024x4096x4096-rank1024-{target}", "--shape", "1024x4096x4096", "--rank", "1024",
             "--target", target)
    # gated MLPs: whole and split, SVD and dense
    for dialect in DIALECTS:
        for mode in ("whole", "split"):
            emit(f"mlp-128-rank1280-{mode}-{dialect}", *MLP, "--rank", "1280", "--param", f"mlp={mode}",
                 "--dialect", dialect)
        emit(f"mlp-128-dense-{dialect}", *MLP, "--dense", "--dialect", dialect)
    emit("mlp-2048-keep0.8-trn2", "--mlp", "--tokens", "2048", "--hidden", "4096", "--intermediate", "14336",
         "--keep-ratio", "0.8", "--target", "trn2")
    emit("mlp-decode-1-ranks", "--mlp", "--tokens", "1", "--hidden", "2048", "--intermediate", "8192",
         "--ranks", "512,512,1024")
    emit("mlp-32-dense-split-trn3", "--mlp", "--tokens", "32", "--hidden", "2048", "--intermediate", "8192",
         "--dense", "--param", "mlp=split", "--target", "trn3")
    # FP8 weights (docs/quantization.md): a dense decode MLP with double_row matmuls, and an SVD one (trn2)
    emit("mlp-fp8-4-dense-trn2", "--mlp", "--tokens", "4", "--hidden", "512", "--intermediate", "1024", "--dense",
         "--dtype", "fp8", "--target", "trn2")
    emit("mlp-fp8-128-keep0.8-trn2", "--mlp", "--tokens", "128", "--hidden", "512", "--intermediate", "1024",
         "--keep-ratio", "0.8", "--dtype", "fp8", "--target", "trn2")
    # FP8 after the norm prologue (rmsnorm_quant before the MLP): residual add, RMSNorm in float32, x quantized on chip
    emit("mlp-fp8-8-dense-rmsnorm-residual-trn2", "--mlp", "--tokens", "8", "--hidden", "512", "--intermediate", "1024",
         "--dense", "--dtype", "fp8", "--fuse-norm", "rmsnorm", "--residual", "--target", "trn2")
    # FP8 with per-token activation scales computed in the kernel (--act-scale row, lowerings/row_scales.py): the maxima
    # from TensorE transposes of the strips (weights stationary), from the rows (activations stationary), and SVD
    emit("mlp-fp8-row-8-dense-trn2", "--mlp", "--tokens", "8", "--hidden", "512", "--intermediate", "1024", "--dense",
         "--dtype", "fp8", "--act-scale", "row", "--target", "trn2")
    emit("mlp-fp8-row-8-dense-stationary-trn2", "--mlp", "--tokens", "8", "--hidden", "512", "--intermediate", "1024",
         "--dense", "--dtype", "fp8", "--act-scale", "row", "--target", "trn2", "--param", "lnc_split=features",
         "--param", "stationary=tokens", "--param", "x_transpose=pe")
    emit("mlp-fp8-row-128-keep0.8-trn2", "--mlp", "--tokens", "128", "--hidden", "512", "--intermediate", "1024",
         "--keep-ratio", "0.8", "--dtype", "fp8", "--act-scale", "row", "--target", "trn2")
    # OCP MX weights on trn3 (docs/mx.md): nc_matmul_mx with x quantize_mx'd on chip from a DMA-interleaved load (mxfp4
    # decode), from the row tiles (MXFP8 E5M2, 3 tokens: a padded stationary), and an MX GEMM
    emit("mlp-mxfp4-1-dense-trn3", "--mlp", "--tokens", "1", "--hidden", "1024", "--intermediate", "2048", "--dense",
         "--dtype", "mxfp4", "--target", "trn3")
    emit("mlp-mxfp8-e5m2-3-dense-trn3", "--mlp", "--tokens", "3", "--hidden", "512", "--intermediate", "1024",
         "--dense", "--dtype", "mxfp8_e5m2", "--target", "trn3", "--param", "x_transpose=pe")
    emit("gemm-mxfp8-77x512x1024-trn3", "--shape", "77x512x1024", "--dtype", "mxfp8_e4m3", "--target", "trn3")
    # every example graph, both dialects, and on trn2
    for graph in GRAPHS:
        for dialect in DIALECTS:
            emit(f"graph-{graph}-{dialect}", "--graph", f"examples/graphs/{graph}.yaml", "--dim", "tokens=256",
                 "--dialect", dialect)
        emit(f"graph-{graph}-decode-trn2", "--graph", f"examples/graphs/{graph}.yaml", "--dim", "tokens=1",
             "--target", "trn2")
    # tuned with a fixed seed (the search itself is part of what must not change)
    tune("tuned-gemm-1024x2048x1024", "--shape", "1024x2048x1024", "--trials", "40")
    tune("tuned-gemm-ragged-3000x5000x700-neuronxcc", "--shape", "3000x5000x700", "--trials", "40",
         "--dialect", "neuronxcc")
    tune("tuned-gemm-decode-1x4096x4096-trn2", "--shape", "1x4096x4096", "--trials", "40", "--target", "trn2")
    tune("tuned-gemm-km-2048x1024x1024-trn3", "--shape", "2048x1024x1024", "--a-layout", "km", "--trials", "40",
         "--target", "trn3")
    tune("tuned-chain-512x8192x2048-keep0.8", "--shape", "512x8192x2048", "--keep-ratio", "0.8", "--trials", "40")
    tune("tuned-mlp-128-rank1280", *MLP, "--rank", "1280", "--trials", "40")
    tune("tuned-mlp-1-dense-trn2", "--mlp", "--tokens", "1", "--hidden", "2048", "--intermediate", "8192", "--dense",
         "--trials", "40", "--target", "trn2", "--dialect", "neuronxcc")
    tune("tuned-graph-lora", "--graph", "examples/graphs/lora.yaml", "--dim", "tokens=256", "--trials", "40")
    # logical cores: each split, a ragged one, the legacy dialect, one physical core of trn2
    emit("gemm-2048x2048x2048-aws-fully-optimized-nki-trn2-lnc1", "--shape", "2048x2048x2048", "--target", "trn2",
         "--lnc", "1")
    emit("lnc2-gemm-m-ragged-500x1024x200-trn2", "--shape", "500x1024x200", "--param", "lnc_split=m",
         "--param", "loop_order=mnk", "--target", "trn2")
    emit("lnc2-gemm-n-1x4096x4096-trn3", "--shape", "1x4096x4096", "--param", "lnc_split=n", "--target", "trn3")
    emit("lnc2-mlp-decode-1-keep0.8-gather-trn2", "--mlp", "--tokens", "1", "--hidden", "2048", "--intermediate",
         "8192", "--keep-ratio", "0.8", "--param", "lnc_split=gather", "--target", "trn2")
    emit("lnc2-mlp-256-rank512-tokens-neuronxcc-trn2", "--mlp", "--tokens", "256", "--hidden", "2048",
         "--intermediate", "8192", "--rank", "512", "--param", "lnc_split=tokens", "--dialect", "neuronxcc",
         "--sdk", "2.29", "--target", "trn2")
    emit("lnc2-mlp-decode-1-dense-intermediate-trn2", "--mlp", "--tokens", "1", "--hidden", "2048", "--intermediate",
         "8192", "--dense", "--param", "lnc_split=intermediate", "--target", "trn2")
    emit("lnc2-mlp-decode-1-dense-hidden-trn2", "--mlp", "--tokens", "1", "--hidden", "2048", "--intermediate",
         "8192", "--dense", "--param", "lnc_split=hidden", "--target", "trn2")
    # the same kernel for Neuron SDK 2.33: its exchange stays nisa.sendrecv(..., pipe_id=0) (2.34: nki.lnc.sendrecv)
    emit("lnc2-mlp-decode-1-dense-hidden-trn2-sdk2.33", "--mlp", "--tokens", "1", "--hidden", "2048",
         "--intermediate", "8192", "--dense", "--param", "lnc_split=hidden", "--target", "trn2", "--sdk", "2.33")
    emit("lnc2-mlp-8-keep0.8-intermediate-trn3", "--mlp", "--tokens", "8", "--hidden", "2048", "--intermediate",
         "8192", "--keep-ratio", "0.8", "--param", "lnc_split=intermediate", "--target", "trn3")
    emit("lnc2-chain-77x1000x600-features-trn2", "--shape", "77x1000x600", "--rank", "256", "--param",
         "lnc_split=features", "--target", "trn2")
    # the norm prologue (residual add, stored sum, RMSNorm/LayerNorm): decode under a split whose programs store
    # halves of the sum, and prefill on one physical core
    emit("prologue-mlp-8-dense-rmsnorm-residual-features-trn2", "--mlp", "--tokens", "8", "--hidden", "2048",
         "--intermediate", "8192", "--dense", "--fuse-norm", "rmsnorm", "--residual", "--param", "lnc_split=features",
         "--target", "trn2")
    emit("prologue-mlp-256-keep0.8-layernorm-trn2-lnc1", "--mlp", "--tokens", "256", "--hidden", "2048",
         "--intermediate", "8192", "--keep-ratio", "0.8", "--fuse-norm", "layernorm", "--target", "trn2", "--lnc", "1")
    # PE column tiles: the decode MLP's down projection, its 64 K tiles 4 at a time in 32-column tiles
    emit("coltile-mlp-decode-8-dense-trn2", "--mlp", "--tokens", "8", "--hidden", "2048", "--intermediate", "8192",
         "--dense", "--param", "column_tiles=4", "--param", "lnc_split=features", "--target", "trn2")
    tune("tuned-lnc2-mlp-1-keep0.8-trn2", "--mlp", "--tokens", "1", "--hidden", "4096", "--intermediate", "14336",
         "--keep-ratio", "0.8", "--trials", "40", "--target", "trn2")
    return cases


CASES = _cases()
