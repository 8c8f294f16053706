"""Audio in and out: reference files decoded and checked (`files`), every output format
encoded (`encoders`)."""
