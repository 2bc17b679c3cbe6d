"""llama.cpp's HF-to-GGUF converter (shipped in llama-cpp-python's sdist) run on the bench
checkpoint, with the BPE pre-tokenizer forced to "gpt-2": the converter recognizes
pre-tokenizers by hashing a test string's tokens and refuses the bench's own tokenizer
otherwise (the random-weight model's text is not the subject, its speed is).

    python bench/gguf_convert.py LLAMA_CPP_DIR HF_DIR --outfile OUT.gguf --outtype f32
"""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    src = Path(sys.argv[1])
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    import conversion.base as base  # the converter's own package

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = [str(src / "convert_hf_to_gguf.py"), *sys.argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
