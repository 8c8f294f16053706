"""A request from text to its end, whatever door it came through: the turn (`turn`), its
events (`events`), and the service that submits turns to the engines (`service`)."""
