"""README's "Your own batch type" example runs as written: a custom SiftingBatch and
transform through the loader, with training between batches."""

import contextlib
import io

from tests.neuron_sift.integrations.readme_examples import example


def test_readme_custom_sifting_batch_example():
    out = io.StringIO()
    namespace = {"__name__": "__main__"}
    with contextlib.redirect_stdout(out):
        exec(compile(example("Your own batch type: SiftingBatch and transform"), "README.md", "exec"), namespace)
    c = namespace["loader"].counts
    assert c.num_orig_samples_seen == 600
    assert c.num_samples_emitted >= 16 * 10 and c.num_samples_emitted % 16 == 0
    assert c.num_orig_samples_kept == c.num_samples_emitted + c.num_samples_pending
    assert out.getvalue().startswith("seen 600, kept ")
