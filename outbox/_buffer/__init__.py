"""The buffer: admission, bounds and the overflow policies, on the handler's side.  It owns
what ``emit`` admits and how it sizes an event (``_event``), the bounded queue with ``put``'s
fast and slow paths, the policies (drop_oldest, drop_newest, block) and the event accounting
under one lock (``_buffer``), what it holds, queued and in flight, by count and bytes, with the
``Overflow`` protocol a spill implements (``_holdings``), the sequence numbers and the journal
of numbers settled (``_numbering``), the lost events counted by reason (``_losses``), and the
waits for room and for a flush (``_waiting``).  It never calls into the network or touches a
disk.  It may import ``outbox._run`` (an event's weight), ``outbox._observability`` and
``outbox._errors``; only its own methods write its fields (``tests/test_structure.py``)."""
