"""Models and data factories beyond the built-in image models, loaded by ``class_path``.

``triaccel.zoo.gpt.GPT``: a small causal language model (nanoGPT-like).
``triaccel.zoo.text.char_corpus``: character-level windows of a corpus that ships with the install.
"""
