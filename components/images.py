"""The container image every pipeline step runs in: this package installed on Paddle 2.6.2.

The steps import the package from it, hence ``install_kfp_package=False`` (kfp is in the image too).
"""

PIPELINE_IMAGE = "paddle-ps-pipelines:0.1.0"
