"""tidal's data plane: everything that moves between actors. Wire frames (`wire`), control messages
(`messages`) and the Arrow schema of trajectories, with its columns declared once (`schema`); the channels
that carry them, in memory for the in-process mode (`memory_channels`) or over ZeroMQ driven by trio
(`zmq_channels`, on `zmq_socket`, secured by `security`), behind one interface (`channels`); the typed ends
actors hold (`endpoints`), the statistics every endpoint reports (`stats`), and weight transfer (`weights`)."""
