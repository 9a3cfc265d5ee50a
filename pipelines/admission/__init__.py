"""Admission: the processor that admits, queues, places and settles generations, and what it reads and keeps."""
