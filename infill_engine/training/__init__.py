"""Training the embedded default model: corpus, tokenizer, infilling objective and the resumable training loop.

    source directories -> corpus (filtered, deduplicated, benchmark-free) -> byte-level BPE tokenizer
                       -> infilling examples laid out by `infill_engine.canvas` -> masked-diffusion training
                       -> checkpoints that `infill_engine.loading.load_denoiser` loads directly
"""
