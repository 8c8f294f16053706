"""`chorus loadtest`: many WebSocket clients against a Chorus server, then a report (`cli`)."""
