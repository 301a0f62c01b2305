// session/served_ports.hpp: the control ports that receiver endpoints of this process serve. A
// sender pushing to HOST:port on this host asks whether that receiver is its own process: CUDA
// IPC cannot serve that pair, since a process cannot open the IPC handles it made. Kept here, in
// the protocol library both ends link, so that the sender need not link the receiver's.
//
// Threading: any thread.
#pragma once

namespace ferry::session {

// An endpoint of this process serves its control API on `port` (ReceiverEndpoint::start), or
// no longer does (stop). Counted: two endpoints may have served the same port in turn.
void note_served_port(int port);
void forget_served_port(int port);

// True while an endpoint of this process serves its control API on `port`.
bool served_in_this_process(int port);

}  // namespace ferry::session
