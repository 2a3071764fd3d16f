// tcp_flows: the packet-level reference for mecsim's TCP transfer times (ns-3.37).
//
// A dumbbell: N senders, each on its own fast access link (10 Gb/s, 0 delay) to a router;
// one bottleneck point-to-point link router -> router2 of --rate_bps and --delay_s one
// way (the ACKs cross the same link back, so the round trip is 2 * delay_s plus
// serialisation); one receiver behind router2 on a fast 0-delay link. Flow i is one
// BulkSendApplication (MaxBytes = --bytes) from sender i to its own PacketSink port on
// the receiver; all flows start at t0 = 1 s.
//
// Measured per flow: from the first data segment the sender's TCP socket transmits (the
// handshake is over: BulkSend hands its bytes to TCP when the SYN/ACK arrives, and the
// first data segment leaves 1 ns later) to the moment the sink has received all --bytes.
// That is the transfer time over an already-open connection; the SYN round trip is not
// in it. One JSON object per flow on stdout:
//   {"flow": i, "bytes": n, "start_s": ..., "end_s": ..., "time_s": ...}
// With --trace_cwnd=1, flow 0's congestion window, slow-start threshold and congestion
// state changes and RTT samples are printed too, as {"trace": "cwnd"|"ssthresh"|"state"|"rtt",
// ...} lines;
// with --trace_segments=1, flow 0's segments sent and ACKs received ("tx", "rx").
// Any ns-3 attribute can be given as --ns3::TypeId::Attribute=value (e.g.
// --ns3::TcpCubic::HyStart=false); the TCP defaults below are set before parsing, so
// those override them (except SocketType, SegmentSize, InitialCwnd, DelAck*, MinRto and
// TcpCubic::HyStartDelayMin/Max, which have options of their own).
//
// TCP as ns-3 and Linux use it: Cubic (or --cc newreno), initial window 10 segments,
// SegmentSize 1448 (1448 + 20 IP + 32 TCP with the timestamp option = 1500, the MTU; a
// 1460-byte segment with timestamps would be 1512 bytes and be fragmented; ns-3's
// point-to-point link adds a 2-byte PPP header, so a full segment is 1502 bytes on the
// wire), SACK and
// timestamps on, send/receive buffers of 128 MiB (the window limits, never the buffer),
// the retransmission timeout as Linux computes it: RTO = SRTT + max(4 RTTVAR, TCP_RTO_MIN)
// (tcp_rtt_estimator floors rttvar at tcp_rto_min each round trip; __tcp_set_rto adds it
// to SRTT), with --min_rto_s as TCP_RTO_MIN (default 0.2 s). ns-3 computes RFC 6298's
// max(SRTT + max(G, 4 RTTVAR), MinRto) with G its ClockGranularity (default 1 ms), so
// both G and MinRto are set to --min_rto_s. With G = 1 ms and MinRto 0.2 s a steady RTT
// leaves the RTO at 0.2 s, below a long path's round trip once a queue has built, and the
// first retransmission after a queue's drop times out spuriously (1 MB at 5 Mb/s, 50 ms
// each way through FqCoDel: 2.638 s with ns-3's rule, 1.994 s with Linux's; ns-3's own
// default MinRto is 1 s),
// delayed ACKs every 2nd segment (ns-3's and Linux's) with a 40 ms timeout (Linux's
// TCP_DELACK_MIN; ns-3's default is 200 ms, and with MinRto 0.2 s that is a trap: once an
// RTO leaves cwnd at 1 segment, the lone segment's ACK is held 200 ms, the RTO (200 ms)
// fires first, cwnd stays 1, and the flow crawls one segment per 200 ms: 2 flows of
// 800 kB over 10 Mb/s took 44 and 82 s instead of ~1.5 s).
// Cubic's HyStart is on, with Linux's delay threshold: slow start ends when a round's
// minimum RTT exceeds the base RTT by RTT/8, clamped to [4, 16] ms (Linux's tcp_cubic.c,
// HYSTART_DELAY_MIN/MAX). ns-3.37 clamps the base RTT itself to [HyStartDelayMin,
// HyStartDelayMax] = [4 ms, 1 s] instead (no /8), so at a 40 ms round trip it waits for
// 40 ms of queue, slow start overshoots to ~5x the path, and FqCoDel's drops cost the flow
// 7-14 % at 10 Mb/s (and one of two flows an RTO); with both attributes set to Linux's
// threshold for the base round trip 2 * delay_s, the delay test is Linux's.
// --hystart_delay_s=0 keeps ns-3.37's own rule; a positive value sets the threshold.
// The bottleneck's queue: an FqCoDelQueueDisc on the router's bottleneck device with a
// 1-packet device queue beneath it (so the packets wait in the queue disc, where CoDel
// sees them, not in the device's 100-packet DropTail queue). Random per-packet loss
// --loss: a RateErrorModel (ERROR_UNIT_PACKET) on router2's receiving bottleneck device
// (data packets only; the ACKs go the other way).

#include "ns3/applications-module.h"
#include "ns3/core-module.h"
#include "ns3/internet-module.h"
#include "ns3/network-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/traffic-control-module.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

using namespace ns3;

namespace
{

struct Flow
{
    uint64_t bytes = 0;
    uint64_t received = 0;
    double start = -1.0;
    double end = -1.0;
    Ptr<BulkSendApplication> app;
};

std::vector<Flow> g_flows;
uint32_t g_done = 0;
bool g_traceSeg = false;

void
SocketTx(uint32_t i, Ptr<const Packet> p, const TcpHeader& h, Ptr<const TcpSocketBase>)
{
    if (g_flows[i].start < 0 && p->GetSize() > 0)
    {
        g_flows[i].start = Simulator::Now().GetSeconds();
    }
    if (g_traceSeg && i == 0)
    {
        std::printf("{\"trace\": \"tx\", \"flow\": 0, \"t\": %.9f, \"seq\": %u, \"len\": %u, "
                    "\"ack\": %u, \"flags\": %u}\n",
                    Simulator::Now().GetSeconds(),
                    h.GetSequenceNumber().GetValue(),
                    p->GetSize(),
                    h.GetAckNumber().GetValue(),
                    h.GetFlags());
    }
}

void
SocketRx(Ptr<const Packet>, const TcpHeader& h, Ptr<const TcpSocketBase>)
{
    std::printf("{\"trace\": \"rx\", \"flow\": 0, \"t\": %.9f, \"ack\": %u, \"flags\": %u, "
                "\"header\": \"%s\"}\n",
                Simulator::Now().GetSeconds(),
                h.GetAckNumber().GetValue(),
                h.GetFlags(),
                [&] { std::ostringstream o; h.Print(o); return o.str(); }().c_str());
}

void
SinkRx(uint32_t i, Ptr<const Packet> p, const Address&)
{
    Flow& f = g_flows[i];
    f.received += p->GetSize();
    if (f.end < 0 && f.received >= f.bytes)
    {
        f.end = Simulator::Now().GetSeconds();
        if (++g_done == g_flows.size())
        {
            Simulator::Stop();
        }
    }
}

void
CwndTrace(uint32_t oldv, uint32_t newv)
{
    std::printf("{\"trace\": \"cwnd\", \"flow\": 0, \"t\": %.9f, \"old\": %u, \"new\": %u}\n",
                Simulator::Now().GetSeconds(),
                oldv,
                newv);
}

void
SsthTrace(uint32_t oldv, uint32_t newv)
{
    std::printf("{\"trace\": \"ssthresh\", \"flow\": 0, \"t\": %.9f, \"old\": %u, \"new\": %u}\n",
                Simulator::Now().GetSeconds(),
                oldv,
                newv);
}

void
StateTrace(TcpSocketState::TcpCongState_t oldv, TcpSocketState::TcpCongState_t newv)
{
    std::printf("{\"trace\": \"state\", \"flow\": 0, \"t\": %.9f, \"old\": \"%s\", \"new\": \"%s\"}\n",
                Simulator::Now().GetSeconds(),
                TcpSocketState::TcpCongStateName[oldv],
                TcpSocketState::TcpCongStateName[newv]);
}

void
RttTrace(Time, Time newv)
{
    std::printf("{\"trace\": \"rtt\", \"flow\": 0, \"t\": %.9f, \"rtt_s\": %.9f}\n",
                Simulator::Now().GetSeconds(),
                newv.GetSeconds());
}

// The socket exists once the application has started (at t0): hook its traces then.
void
HookSocket(uint32_t i, bool traceCwnd)
{
    Ptr<TcpSocketBase> s = DynamicCast<TcpSocketBase>(g_flows[i].app->GetSocket());
    NS_ABORT_MSG_IF(!s, "flow " << i << ": no TCP socket after the application started");
    s->TraceConnectWithoutContext("Tx", MakeBoundCallback(&SocketTx, i));
    if (traceCwnd && i == 0)
    {
        s->TraceConnectWithoutContext("CongestionWindow", MakeCallback(&CwndTrace));
        s->TraceConnectWithoutContext("SlowStartThreshold", MakeCallback(&SsthTrace));
        s->TraceConnectWithoutContext("CongState", MakeCallback(&StateTrace));
        s->TraceConnectWithoutContext("RTT", MakeCallback(&RttTrace));
    }
    if (g_traceSeg && i == 0)
    {
        s->TraceConnectWithoutContext("Rx", MakeCallback(&SocketRx));
    }
}

} // namespace

int
main(int argc, char* argv[])
{
    uint32_t flows = 1;
    uint64_t bytes = 800040;
    double rateBps = 10e6;
    double delayS = 0.02;
    double loss = 0.0;
    std::string cc = "cubic";
    double minRtoS = 0.2;
    uint32_t seed = 1;
    uint32_t run = 1;
    double accessBps = 10e9;
    std::string deviceQueue = "1p";
    std::string queueDisc = "ns3::FqCoDelQueueDisc";
    double stopS = 3600.0;
    bool traceCwnd = false;
    uint32_t segmentSize = 1448;
    uint32_t initialCwnd = 10;
    uint32_t delAckCount = 2;
    double delAckTimeoutS = 0.04;
    double hystartDelayS = -1.0;

    // set before parsing: --ns3::TcpSocket::SndBufSize=... and the like override these
    Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(1u << 27));
    Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(1u << 27));
    Config::SetDefault("ns3::TcpSocketBase::Sack", BooleanValue(true));
    Config::SetDefault("ns3::TcpSocketBase::Timestamp", BooleanValue(true));
    Config::SetDefault("ns3::TcpSocketBase::WindowScaling", BooleanValue(true));


    CommandLine cmd(__FILE__);
    cmd.AddValue("flows", "number of flows sharing the bottleneck", flows);
    cmd.AddValue("bytes", "bytes each flow sends", bytes);
    cmd.AddValue("rate_bps", "bottleneck rate, bit/s", rateBps);
    cmd.AddValue("delay_s", "bottleneck one-way propagation delay, s", delayS);
    cmd.AddValue("loss", "per-packet loss probability on the bottleneck (data direction)", loss);
    cmd.AddValue("cc", "congestion control: cubic or newreno", cc);
    cmd.AddValue("min_rto_s", "Linux's TCP_RTO_MIN: RTO = SRTT + max(4 RTTVAR, this), s", minRtoS);
    cmd.AddValue("seed", "RngSeedManager seed", seed);
    cmd.AddValue("run", "RngSeedManager run number", run);
    cmd.AddValue("access_bps", "access links' rate, bit/s", accessBps);
    cmd.AddValue("device_queue", "bottleneck device's own queue size (under the queue disc)",
                 deviceQueue);
    cmd.AddValue("queue_disc", "bottleneck queue disc type id", queueDisc);
    cmd.AddValue("stop_s", "simulated time limit, s", stopS);
    cmd.AddValue("trace_cwnd", "print flow 0's cwnd/ssthresh/state changes", traceCwnd);
    cmd.AddValue("trace_segments", "print flow 0's segments sent and ACKs received", g_traceSeg);
    cmd.AddValue("segment_size", "TCP segment size, bytes", segmentSize);
    cmd.AddValue("initial_cwnd", "initial window, segments", initialCwnd);
    cmd.AddValue("del_ack_count", "segments per delayed ACK", delAckCount);
    cmd.AddValue("del_ack_timeout_s", "delayed ACK timeout, s (Linux: 0.04)", delAckTimeoutS);
    cmd.AddValue("hystart_delay_s",
                 "Cubic's HyStart delay threshold, s (-1: Linux's, clamp(2 * delay_s / 8, "
                 "4 ms, 16 ms); 0: ns-3.37's own rule)",
                 hystartDelayS);
    cmd.Parse(argc, argv);
    NS_ABORT_MSG_IF(flows < 1, "--flows must be at least 1");
    NS_ABORT_MSG_IF(bytes < 1, "--bytes must be at least 1");

    RngSeedManager::SetSeed(seed);
    RngSeedManager::SetRun(run);

    std::string ccType;
    if (cc == "cubic")
    {
        ccType = "ns3::TcpCubic";
    }
    else if (cc == "newreno")
    {
        ccType = "ns3::TcpNewReno";
    }
    else
    {
        NS_ABORT_MSG("--cc must be cubic or newreno, not " << cc);
    }
    Config::SetDefault("ns3::TcpL4Protocol::SocketType", TypeIdValue(TypeId::LookupByName(ccType)));
    Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(segmentSize));
    Config::SetDefault("ns3::TcpSocket::InitialCwnd", UintegerValue(initialCwnd));
    Config::SetDefault("ns3::TcpSocket::DelAckCount", UintegerValue(delAckCount));
    Config::SetDefault("ns3::TcpSocket::DelAckTimeout", TimeValue(Seconds(delAckTimeoutS)));
    Config::SetDefault("ns3::TcpSocketBase::MinRto", TimeValue(Seconds(minRtoS)));
    Config::SetDefault("ns3::TcpSocketBase::ClockGranularity", TimeValue(Seconds(minRtoS)));
    if (hystartDelayS < 0)
    {
        hystartDelayS = std::min(std::max(2.0 * delayS / 8.0, 0.004), 0.016);
    }
    if (hystartDelayS > 0)
    {
        Config::SetDefault("ns3::TcpCubic::HyStartDelayMin", TimeValue(Seconds(hystartDelayS)));
        Config::SetDefault("ns3::TcpCubic::HyStartDelayMax", TimeValue(Seconds(hystartDelayS)));
    }

    // nodes: senders 0..N-1, router, router2, receiver
    NodeContainer senders;
    senders.Create(flows);
    Ptr<Node> router = CreateObject<Node>();
    Ptr<Node> router2 = CreateObject<Node>();
    Ptr<Node> receiver = CreateObject<Node>();
    InternetStackHelper stack;
    stack.Install(senders);
    stack.Install(router);
    stack.Install(router2);
    stack.Install(receiver);

    PointToPointHelper access;
    access.SetDeviceAttribute("DataRate", DataRateValue(DataRate(uint64_t(accessBps))));
    access.SetChannelAttribute("Delay", TimeValue(Seconds(0)));

    PointToPointHelper bottleneck;
    bottleneck.SetDeviceAttribute("DataRate", DataRateValue(DataRate(uint64_t(rateBps))));
    bottleneck.SetChannelAttribute("Delay", TimeValue(Seconds(delayS)));
    bottleneck.SetQueue("ns3::DropTailQueue", "MaxSize", QueueSizeValue(QueueSize(deviceQueue)));

    Ipv4AddressHelper address;
    for (uint32_t i = 0; i < flows; ++i)
    {
        NetDeviceContainer d = access.Install(senders.Get(i), router);
        char base[32];
        std::snprintf(base, sizeof base, "10.%u.%u.0", 1 + i / 250, i % 250);
        address.SetBase(base, "255.255.255.0");
        address.Assign(d);
    }

    NetDeviceContainer bn = bottleneck.Install(router, router2);
    // Ipv4AddressHelper::Assign installs ns-3's default queue disc on any device without
    // one; the bottleneck's is set here first, so it is the one asked for.
    TrafficControlHelper tch;
    tch.SetRootQueueDisc(queueDisc);
    tch.Install(bn.Get(0));
    address.SetBase("192.168.1.0", "255.255.255.0");
    address.Assign(bn);
    if (loss > 0)
    {
        Ptr<RateErrorModel> em = CreateObject<RateErrorModel>();
        em->SetUnit(RateErrorModel::ERROR_UNIT_PACKET);
        em->SetRate(loss);
        em->AssignStreams(1000);
        bn.Get(1)->SetAttribute("ReceiveErrorModel", PointerValue(em));
    }

    NetDeviceContainer rd = access.Install(router2, receiver);
    address.SetBase("192.168.2.0", "255.255.255.0");
    Ipv4InterfaceContainer rif = address.Assign(rd);
    Ipv4GlobalRoutingHelper::PopulateRoutingTables();

    const double t0 = 1.0;
    g_flows.resize(flows);
    for (uint32_t i = 0; i < flows; ++i)
    {
        uint16_t port = 5000 + i;
        PacketSinkHelper sinkHelper("ns3::TcpSocketFactory",
                                    InetSocketAddress(Ipv4Address::GetAny(), port));
        ApplicationContainer sink = sinkHelper.Install(receiver);
        sink.Start(Seconds(0.0));
        sink.Get(0)->TraceConnectWithoutContext("Rx", MakeBoundCallback(&SinkRx, i));

        BulkSendHelper bulk("ns3::TcpSocketFactory", InetSocketAddress(rif.GetAddress(1), port));
        bulk.SetAttribute("MaxBytes", UintegerValue(bytes));
        bulk.SetAttribute("SendSize", UintegerValue(1u << 16));
        ApplicationContainer app = bulk.Install(senders.Get(i));
        app.Start(Seconds(t0));
        g_flows[i].bytes = bytes;
        g_flows[i].app = DynamicCast<BulkSendApplication>(app.Get(0));
        Simulator::Schedule(Seconds(t0) + NanoSeconds(1), &HookSocket, i, traceCwnd);
    }

    Simulator::Stop(Seconds(stopS));
    Simulator::Run();

    int unfinished = 0;
    for (uint32_t i = 0; i < flows; ++i)
    {
        const Flow& f = g_flows[i];
        if (f.end < 0)
        {
            ++unfinished;
            std::fprintf(stderr,
                         "flow %u: %llu of %llu bytes received by the %.1f s limit\n",
                         i,
                         (unsigned long long)f.received,
                         (unsigned long long)f.bytes,
                         stopS);
            continue;
        }
        std::printf("{\"flow\": %u, \"bytes\": %llu, \"start_s\": %.9f, \"end_s\": %.9f, "
                    "\"time_s\": %.9f}\n",
                    i,
                    (unsigned long long)f.bytes,
                    f.start,
                    f.end,
                    f.end - f.start);
    }
    Simulator::Destroy();
    return unfinished ? 1 : 0;
}
