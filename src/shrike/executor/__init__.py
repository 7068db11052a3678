"""The op executor: a model's forward, written once in Python against a `Step`, runs either eagerly
(`EagerStep`: each op called on torch tensors as the model reaches it) or recorded once into an op
tape (`tape.record`) that the C++ executor replays every step (`compile.CompiledTape`)."""
