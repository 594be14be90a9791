"""Edge and cloud backends behind one small interface."""
