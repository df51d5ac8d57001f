"""A user's Keras step traced for placing (`measurers.tf.apply`), as the importer traces it."""

import pytest

pytest.importorskip("tensorflow")


def test_trace_user_keras_step__a_module_level_layer_gets_the_names_and_hash_of_the_import():
    """``trace_user_keras_step`` calls the function after ``clear_session``, which keeps a module-level layer
    ("dense") but restarts the counters that named the function's own Dense "dense" too: Keras refused the
    model. Its step now has the names, and so the hash, that the import of the same spec has."""
    from fixtures import keras_shared_layer
    from graphs.tf.importer import import_keras_spec
    from measurers.tf.apply import trace_user_keras_step

    imported = import_keras_spec("fixtures.keras_shared_layer:build", batch_size=2, name="shared")
    before = len(keras_shared_layer.CALLS)
    user = trace_user_keras_step(keras_shared_layer.build, "shared", batch_size=2)
    assert len(keras_shared_layer.CALLS) == before + 1
    assert user.graph.content_hash == imported.content_hash
