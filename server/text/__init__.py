"""What happens to a request's text before the engine sees it: the pronunciation lexicon,
then normalisation (`normalize_text`). Both are torch-free and run off the event loop."""
