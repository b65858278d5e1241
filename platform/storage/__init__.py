"""The storage root and one run per artifact: the root and its layout, locks, remote locks, conditional objects, disk space."""
