"""Request planning: text into chunks with target lengths, and each chunk into its canvas, by the
reference's own rules."""
