"""Word (and character) timestamps: where each word of the text sits in the audio."""
