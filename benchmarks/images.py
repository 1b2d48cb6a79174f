"""Images in prompts (a corpus with ``images:``, a profile with an mmproj): what each step encodes again.

An image after what a step keeps is re-processed whole: the vision tower encodes it again and its tokens are decoded
again. A resend should encode none; on a hybrid, a step that returns to a checkpoint before an image encodes it again
(docs/llama-server-reuse.md, images). n/a for a session whose documents carry no image.
"""

from . import common


class Images(common.SessionFigures):
    """Image tokens each reuse step re-processed, the images the server's log shows it encoded, and the seconds the
    encodes took."""

    params = (common.SIZES, common.VARIANTS, common.REUSE_STEPS)
    param_names = ["size", "variant", "step"]
    unit = "tokens"
    version = "1"

    track_image_tokens_reprocessed = common.track("image_tokens_reprocessed")
    track_images_encoded = common.track("images_encoded", unit="images")
    track_image_encode_seconds = common.track("image_encode_seconds", unit="seconds")
