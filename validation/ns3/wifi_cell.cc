// One 802.11ax cell: N stations upload the same number of bytes over TCP, all at once, to
// a server behind the access point. The reference for mecsim's Wi-Fi cell model
// (channel/phy.py: wifi_cell_goodput_bps, wifi_cell_upload_times_s).
//
//   stations --(802.11ax, 5 GHz, IdealWifiManager)-- AP --(point-to-point)-- server
//
// PHY: YansWifiChannelHelper::Default() (LogDistancePropagationLossModel: exponent 3,
// reference loss 46.6777 dB at 1 m; constant-speed delay), YansWifiPhy with ns-3's
// TableBasedErrorRateModel, tx power --tx_power_dbm on every node, RxNoiseFigure 7 dB,
// HE guard interval --gi_ns on every node, one antenna and one spatial stream.
// MAC: ns-3.37 defaults (BE: AIFSN 3, CWmin 15, CWmax 1023, TXOP limit 0; A-MPDU up to
// BE_MaxAmpduSize 65,535 bytes, Block Ack window 64 MPDUs, no A-MSDU, no RTS/CTS),
// WifiNetDevice MTU set to 1,500 bytes.
// TCP: Cubic, SegmentSize 1,448 (1,500-byte packets with timestamps), InitialCwnd 10,
// SACK, timestamps, send/receive buffers --tcp_buffer_bytes, SYN timeout 200 ms, and
// three settings Linux's where ns-3.37's differ and trap the reference, as in
// tcp_flows.cc (validation/README.md): the retransmission timeout SRTT + max(4 RTTVAR,
// --min_rto_ms) (MinRto and ClockGranularity both --min_rto_ms, 200 ms as Linux's
// TCP_RTO_MIN); delayed ACKs every 2nd segment or after --del_ack_timeout_ms (40 ms,
// Linux's TCP_DELACK_MIN; with ns-3's 200 ms and ns-3's RTO rule, which leaves the RTO at
// 200 ms, once an RTO leaves cwnd at 1 segment its ACK is held past the next RTO and the
// flow sends one segment per 200 ms: a station of 11 at 30-36 m, 20 MHz, 3 MB took 241 s
// instead of 5; either Linux setting alone avoids it); and HyStart's delay threshold
// --hystart_delay_ms (4 ms: Linux's clamp(RTT / 8, 4 ms, 16 ms) for any round trip
// below 32 ms, as a cell's are; ns-3.37 clamps the RTT itself to [4 ms, 1 s]; 0 keeps it).
//
// No hidden terminals: every station stands on the same ray from the AP (x axis), so two
// stations are at most max(d) - min(d) apart; the program computes every pair's received
// power with the same loss model and refuses to run if one is below the preamble detection
// threshold (ThresholdPreambleDetectionModel: -82 dBm, 4 dB SNR) plus --margin_db.
//
// Sequence: t = 0.5 s association settles; each station exchanges --warmup_packets UDP
// echoes with the server from t = 1 s (ARP, Block Ack agreement and the rate manager's
// SNR are in place before TCP; ns-3.37 can lose a station's first SYN otherwise); at
// t = 2 s each station opens its TCP connection; at t = 3 s (--start_s) every station
// starts writing its --bytes. time_s of a station = time its last byte reached the server
// - start; that is first data byte sent -> last byte received.
//
// Output: one JSON line per station {station, distance_m, snr_db, mcs, time_s, ...}:
// snr_db is the mean SNR ns-3 computed at the AP for that station's QoS data MPDUs
// (MonitorSnifferRx: signal - noise, dB), mcs the MCS most of them used; then one summary
// line {"summary": ...} with the parameters.
//
// --trace=1 also writes, to stderr, from the start on (times in s after it): every PSDU
// a node begins to send, "T <t> <from>-><to> <kind> n=<MPDUs> bytes=<PSDU bytes>
// mcs=<MCS> dur_us=<PPDU duration> retry=<0|1>" (from/to: a station's index or "ap";
// kind: data (a QoS data MPDU of more than 1,000 bytes: TCP segments), tack (smaller QoS
// data: TCP ACKs), ba, bar, ack, other), and every change of a station's congestion window,
// "C <t> <station> <cwnd in 1,448-byte segments>". The results do not change.
//
// Build: g++ -O2 -std=c++17 wifi_cell.cc $(pkg-config --cflags --libs ns3-core ns3-network
//   ns3-internet ns3-point-to-point ns3-applications ns3-traffic-control ns3-wifi
//   ns3-mobility ns3-propagation) -o /tmp/wifi_cell
#include "ns3/applications-module.h"
#include "ns3/core-module.h"
#include "ns3/internet-module.h"
#include "ns3/mobility-module.h"
#include "ns3/network-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/propagation-module.h"
#include "ns3/wifi-module.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace ns3;

namespace
{

struct StationState
{
    double distanceM = 0;
    uint64_t received = 0;
    uint64_t written = 0;
    double doneS = -1;
    bool connected = false;
    Ptr<Socket> socket;
    std::map<uint32_t, uint64_t> mcsCount; // MCS -> QoS data MPDUs received at the AP
    double snrDbSum = 0;
    uint64_t snrCount = 0;
    uint64_t retries = 0;
};

std::vector<StationState> g_sta;
std::map<Mac48Address, uint32_t> g_staByMac;
uint64_t g_bytes = 0;
double g_startS = 3.0;
uint32_t g_done = 0;
bool g_trace = false;

std::vector<double>
ParseList(const std::string& text)
{
    std::vector<double> values;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ','))
    {
        if (!item.empty())
        {
            values.push_back(std::stod(item));
        }
    }
    return values;
}

void
OnApSniff(Ptr<const Packet> packet,
          uint16_t /* channelFreqMhz */,
          WifiTxVector txVector,
          MpduInfo aMpdu,
          SignalNoiseDbm signalNoise,
          uint16_t /* staId */)
{
    if (Simulator::Now().GetSeconds() < g_startS ||
        txVector.GetMode().GetModulationClass() != WIFI_MOD_CLASS_HE)
    {
        return;
    }
    // an MPDU of an A-MPDU comes with its subframe delimiter
    Ptr<Packet> copy = packet->Copy();
    if (aMpdu.type != NORMAL_MPDU)
    {
        AmpduSubframeHeader delimiter;
        copy->RemoveHeader(delimiter);
    }
    WifiMacHeader header;
    copy->PeekHeader(header);
    if (!header.IsQosData())
    {
        return;
    }
    auto it = g_staByMac.find(header.GetAddr2());
    if (it == g_staByMac.end())
    {
        return;
    }
    StationState& s = g_sta[it->second];
    s.mcsCount[txVector.GetMode().GetMcsValue()]++;
    s.snrDbSum += signalNoise.signal - signalNoise.noise;
    s.snrCount++;
    if (header.IsRetry())
    {
        s.retries++;
    }
}

void
OnSinkRx(uint32_t i, Ptr<const Packet> packet, const Address& /* from */)
{
    StationState& s = g_sta[i];
    s.received += packet->GetSize();
    if (s.doneS < 0 && s.received >= g_bytes)
    {
        s.doneS = Simulator::Now().GetSeconds() - g_startS;
        if (++g_done == g_sta.size())
        {
            Simulator::Stop(MilliSeconds(1));
        }
    }
}

void
Fill(uint32_t i, Ptr<Socket> socket, uint32_t /* available */)
{
    StationState& s = g_sta[i];
    while (s.written < g_bytes && socket->GetTxAvailable() > 0)
    {
        uint32_t chunk = std::min<uint64_t>(socket->GetTxAvailable(), g_bytes - s.written);
        int sent = socket->Send(Create<Packet>(chunk));
        if (sent <= 0)
        {
            break;
        }
        s.written += sent;
    }
}

void
StartWriting(uint32_t i)
{
    StationState& s = g_sta[i];
    if (!s.connected)
    {
        std::fprintf(stderr, "station %u: TCP connection not open at the start\n", i);
    }
    s.socket->SetSendCallback(MakeBoundCallback(&Fill, i));
    Fill(i, s.socket, 0);
}

void
OnCwnd(uint32_t i, uint32_t /* old */, uint32_t cwnd)
{
    if (Simulator::Now().GetSeconds() >= g_startS)
    {
        std::fprintf(stderr,
                     "C %.6f %u %.3f\n",
                     Simulator::Now().GetSeconds() - g_startS,
                     i,
                     cwnd / 1448.0);
    }
}

void
OnPsduTxBegin(std::string who, WifiConstPsduMap psdus, WifiTxVector txVector, double /* w */)
{
    if (Simulator::Now().GetSeconds() < g_startS)
    {
        return;
    }
    Time duration = WifiPhy::CalculateTxDuration(psdus, txVector, WIFI_PHY_BAND_5GHZ);
    for (const auto& [staId, psdu] : psdus)
    {
        const WifiMacHeader& header = psdu->GetHeader(0);
        std::string kind = "other";
        if (header.IsQosData())
        {
            kind = psdu->GetPayload(0)->GetSize() > 1000 ? "data" : "tack";
        }
        else if (header.IsBlockAck())
        {
            kind = "ba";
        }
        else if (header.IsBlockAckReq())
        {
            kind = "bar";
        }
        else if (header.IsAck())
        {
            kind = "ack";
        }
        auto it = g_staByMac.find(header.GetAddr1());
        std::string to = it == g_staByMac.end() ? "ap" : std::to_string(it->second);
        std::fprintf(stderr,
                     "T %.6f %s->%s %s n=%zu bytes=%u mcs=%u dur_us=%.1f retry=%d\n",
                     Simulator::Now().GetSeconds() - g_startS,
                     who.c_str(),
                     to.c_str(),
                     kind.c_str(),
                     psdu->GetNMpdus(),
                     psdu->GetSize(),
                     (unsigned)txVector.GetMode().GetMcsValue(),
                     duration.GetNanoSeconds() / 1e3,
                     header.IsRetry() ? 1 : 0);
    }
}

void
OnConnected(uint32_t i, Ptr<Socket> /* socket */)
{
    g_sta[i].connected = true;
}

void
OnConnectFailed(uint32_t i, Ptr<Socket> /* socket */)
{
    std::fprintf(stderr, "station %u: TCP connection failed\n", i);
}

void
Connect(uint32_t i, Ptr<Node> node, Address server)
{
    Ptr<Socket> socket = Socket::CreateSocket(node, TcpSocketFactory::GetTypeId());
    socket->Bind();
    socket->SetConnectCallback(MakeBoundCallback(&OnConnected, i),
                               MakeBoundCallback(&OnConnectFailed, i));
    socket->Connect(server);
    if (g_trace)
    {
        socket->TraceConnectWithoutContext("CongestionWindow", MakeBoundCallback(&OnCwnd, i));
    }
    g_sta[i].socket = socket;
}

} // namespace

int
main(int argc, char* argv[])
{
    uint32_t stations = 1;
    std::string distancesText;
    double minDistanceM = 5;
    double maxDistanceM = 60;
    uint64_t bytes = 800040;
    uint16_t channelWidthMhz = 20;
    uint16_t giNs = 800;
    double txPowerDbm = 20;
    double noiseFigureDb = 7;
    std::string p2pRate = "1Gbps";
    double p2pDelayMs = 1;
    uint32_t tcpBufferBytes = 4 << 20;
    uint32_t warmupPackets = 3;
    double marginDb = 0;
    double maxTimeS = 600;
    double minRtoMs = 200;
    double delAckTimeoutMs = 40;
    double hystartDelayMs = 4;
    uint32_t seed = 1;

    CommandLine cmd;
    cmd.AddValue("stations", "number of stations", stations);
    cmd.AddValue("distances_m", "comma-separated distances (m), one per station", distancesText);
    cmd.AddValue("min_m", "nearest station (m) if no --distances_m", minDistanceM);
    cmd.AddValue("max_m", "farthest station (m) if no --distances_m", maxDistanceM);
    cmd.AddValue("bytes", "bytes each station uploads", bytes);
    cmd.AddValue("width_mhz", "channel width (20, 40, 80, 160 MHz)", channelWidthMhz);
    cmd.AddValue("gi_ns", "HE guard interval (800, 1600, 3200 ns)", giNs);
    cmd.AddValue("tx_power_dbm", "transmit power of every node (dBm)", txPowerDbm);
    cmd.AddValue("noise_figure_db", "receiver noise figure (dB)", noiseFigureDb);
    cmd.AddValue("p2p_rate", "AP-server link rate", p2pRate);
    cmd.AddValue("p2p_delay_ms", "AP-server link delay (ms)", p2pDelayMs);
    cmd.AddValue("tcp_buffer_bytes", "TCP send and receive buffers (bytes)", tcpBufferBytes);
    cmd.AddValue("warmup_packets", "UDP echoes per station before TCP", warmupPackets);
    cmd.AddValue("margin_db", "required margin over -82 dBm between any two stations", marginDb);
    cmd.AddValue("min_rto_ms", "TCP minimum retransmission timeout (ms)", minRtoMs);
    cmd.AddValue("del_ack_timeout_ms", "TCP delayed-ACK timeout (ms)", delAckTimeoutMs);
    cmd.AddValue("hystart_delay_ms",
                 "Cubic's HyStart delay threshold (ms; 0: ns-3.37's own rule)",
                 hystartDelayMs);
    cmd.AddValue("max_time_s", "simulated time limit after the start (s)", maxTimeS);
    cmd.AddValue("seed", "RNG run number", seed);
    cmd.AddValue("trace", "write PSDUs sent and congestion windows to stderr", g_trace);
    cmd.Parse(argc, argv);

    RngSeedManager::SetSeed(1);
    RngSeedManager::SetRun(seed);
    g_bytes = bytes;

    std::vector<double> distances = ParseList(distancesText);
    if (distances.empty())
    {
        for (uint32_t i = 0; i < stations; i++)
        {
            distances.push_back(stations == 1 ? minDistanceM
                                              : minDistanceM + (maxDistanceM - minDistanceM) * i /
                                                                   (stations - 1));
        }
    }
    NS_ABORT_MSG_IF(distances.size() != stations, "need one distance per station");
    g_sta.resize(stations);
    for (uint32_t i = 0; i < stations; i++)
    {
        g_sta[i].distanceM = distances[i];
    }

    // No hidden terminals: every pair of stations (and every station and the AP) must hear
    // each other's preambles.
    Ptr<LogDistancePropagationLossModel> loss = CreateObject<LogDistancePropagationLossModel>();
    double dMin = *std::min_element(distances.begin(), distances.end());
    double dMax = *std::max_element(distances.begin(), distances.end());
    auto rxDbm = [&](double d) {
        Ptr<ConstantPositionMobilityModel> a = CreateObject<ConstantPositionMobilityModel>();
        Ptr<ConstantPositionMobilityModel> b = CreateObject<ConstantPositionMobilityModel>();
        b->SetPosition(Vector(std::max(d, 0.01), 0, 0));
        return loss->CalcRxPower(txPowerDbm, a, b);
    };
    double worstPairDbm = std::min(rxDbm(dMax - dMin), rxDbm(dMax));
    NS_ABORT_MSG_IF(worstPairDbm < -82 + marginDb,
                    "hidden terminals: a pair receives " << worstPairDbm << " dBm");

    Config::SetDefault("ns3::TcpL4Protocol::SocketType", TypeIdValue(TcpCubic::GetTypeId()));
    Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(1448));
    Config::SetDefault("ns3::TcpSocket::InitialCwnd", UintegerValue(10));
    Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(tcpBufferBytes));
    Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(tcpBufferBytes));
    Config::SetDefault("ns3::TcpSocketBase::Sack", BooleanValue(true));
    // Linux's 200 ms minimum RTO (ns-3's default is 1 s), and a SYN lost despite the
    // warm-up is sent again after 200 ms, well before the start
    Config::SetDefault("ns3::TcpSocketBase::MinRto", TimeValue(MilliSeconds(minRtoMs)));
    Config::SetDefault("ns3::TcpSocketBase::ClockGranularity", TimeValue(MilliSeconds(minRtoMs)));
    Config::SetDefault("ns3::TcpSocket::DelAckCount", UintegerValue(2));
    Config::SetDefault("ns3::TcpSocket::DelAckTimeout", TimeValue(MilliSeconds(delAckTimeoutMs)));
    if (hystartDelayMs > 0)
    {
        Config::SetDefault("ns3::TcpCubic::HyStartDelayMin",
                           TimeValue(MicroSeconds(hystartDelayMs * 1000)));
        Config::SetDefault("ns3::TcpCubic::HyStartDelayMax",
                           TimeValue(MicroSeconds(hystartDelayMs * 1000)));
    }
    Config::SetDefault("ns3::TcpSocket::ConnTimeout", TimeValue(MilliSeconds(200)));
    Config::SetDefault("ns3::TcpSocketBase::Timestamp", BooleanValue(true));

    NodeContainer staNodes;
    staNodes.Create(stations);
    NodeContainer apNode;
    apNode.Create(1);
    NodeContainer serverNode;
    serverNode.Create(1);

    YansWifiChannelHelper channel = YansWifiChannelHelper::Default();
    YansWifiPhyHelper phy;
    phy.SetChannel(channel.Create());
    std::ostringstream settings;
    settings << "{0, " << channelWidthMhz << ", BAND_5GHZ, 0}";
    phy.Set("ChannelSettings", StringValue(settings.str()));
    phy.Set("TxPowerStart", DoubleValue(txPowerDbm));
    phy.Set("TxPowerEnd", DoubleValue(txPowerDbm));
    phy.Set("RxNoiseFigure", DoubleValue(noiseFigureDb));

    WifiHelper wifi;
    wifi.SetStandard(WIFI_STANDARD_80211ax);
    wifi.SetRemoteStationManager("ns3::IdealWifiManager");
    WifiMacHelper mac;
    Ssid ssid("mecsim");
    mac.SetType("ns3::StaWifiMac", "Ssid", SsidValue(ssid));
    NetDeviceContainer staDevices = wifi.Install(phy, mac, staNodes);
    mac.SetType("ns3::ApWifiMac", "Ssid", SsidValue(ssid));
    NetDeviceContainer apDevice = wifi.Install(phy, mac, apNode);
    NetDeviceContainer wifiDevices(staDevices, apDevice);
    for (uint32_t i = 0; i < wifiDevices.GetN(); i++)
    {
        Ptr<WifiNetDevice> dev = DynamicCast<WifiNetDevice>(wifiDevices.Get(i));
        dev->SetMtu(1500);
        dev->GetHeConfiguration()->SetGuardInterval(NanoSeconds(giNs));
    }
    for (uint32_t i = 0; i < stations; i++)
    {
        g_staByMac[Mac48Address::ConvertFrom(staDevices.Get(i)->GetAddress())] = i;
    }

    MobilityHelper mobility;
    Ptr<ListPositionAllocator> positions = CreateObject<ListPositionAllocator>();
    positions->Add(Vector(0, 0, 0)); // AP
    positions->Add(Vector(0, 0, 0)); // server (wired; position unused)
    for (double d : distances)
    {
        positions->Add(Vector(d, 0, 0));
    }
    mobility.SetPositionAllocator(positions);
    mobility.SetMobilityModel("ns3::ConstantPositionMobilityModel");
    mobility.Install(apNode);
    mobility.Install(serverNode);
    mobility.Install(staNodes);

    PointToPointHelper p2p;
    p2p.SetDeviceAttribute("DataRate", StringValue(p2pRate));
    p2p.SetChannelAttribute("Delay", TimeValue(MicroSeconds(p2pDelayMs * 1000)));
    NetDeviceContainer wired = p2p.Install(apNode.Get(0), serverNode.Get(0));

    InternetStackHelper internet;
    internet.Install(staNodes);
    internet.Install(apNode);
    internet.Install(serverNode);
    Ipv4AddressHelper address;
    address.SetBase("10.1.0.0", "255.255.0.0");
    address.Assign(wifiDevices);
    address.SetBase("10.2.0.0", "255.255.255.0");
    Ipv4InterfaceContainer wiredIf = address.Assign(wired);
    Ipv4Address serverAddress = wiredIf.GetAddress(1);
    Ipv4GlobalRoutingHelper::PopulateRoutingTables();

    // warm-up: UDP echoes station <-> server
    UdpEchoServerHelper echoServer(9);
    ApplicationContainer echo = echoServer.Install(serverNode.Get(0));
    echo.Start(Seconds(0.5));
    for (uint32_t i = 0; i < stations; i++)
    {
        UdpEchoClientHelper client(serverAddress, 9);
        client.SetAttribute("MaxPackets", UintegerValue(warmupPackets));
        client.SetAttribute("Interval", TimeValue(MilliSeconds(100)));
        client.SetAttribute("PacketSize", UintegerValue(100));
        ApplicationContainer app = client.Install(staNodes.Get(i));
        app.Start(Seconds(1.0 + 0.01 * i));
        app.Stop(Seconds(1.9));
    }

    for (uint32_t i = 0; i < stations; i++)
    {
        uint16_t port = 5000 + i;
        PacketSinkHelper sink("ns3::TcpSocketFactory", InetSocketAddress(Ipv4Address::GetAny(), port));
        ApplicationContainer app = sink.Install(serverNode.Get(0));
        app.Start(Seconds(0.5));
        app.Get(0)->TraceConnectWithoutContext("Rx", MakeBoundCallback(&OnSinkRx, i));
        Simulator::Schedule(Seconds(2.0 + 0.005 * i),
                            &Connect,
                            i,
                            staNodes.Get(i),
                            Address(InetSocketAddress(serverAddress, port)));
        Simulator::Schedule(Seconds(g_startS), &StartWriting, i);
    }

    if (g_trace)
    {
        for (uint32_t i = 0; i < wifiDevices.GetN(); i++)
        {
            std::string who = i < stations ? std::to_string(i) : "ap";
            DynamicCast<WifiNetDevice>(wifiDevices.Get(i))
                ->GetPhy()
                ->TraceConnectWithoutContext("PhyTxPsduBegin",
                                             MakeBoundCallback(&OnPsduTxBegin, who));
        }
    }
    Ptr<WifiPhy> apPhy = DynamicCast<WifiNetDevice>(apDevice.Get(0))->GetPhy();
    apPhy->TraceConnectWithoutContext("MonitorSnifferRx", MakeCallback(&OnApSniff));

    Simulator::Stop(Seconds(g_startS + maxTimeS));
    Simulator::Run();

    double last = 0;
    for (uint32_t i = 0; i < stations; i++)
    {
        const StationState& s = g_sta[i];
        uint32_t mcs = 0;
        uint64_t best = 0;
        std::ostringstream hist;
        for (const auto& [m, count] : s.mcsCount)
        {
            hist << (hist.tellp() > 0 ? ", " : "") << "\"" << m << "\": " << count;
            if (count > best)
            {
                best = count;
                mcs = m;
            }
        }
        last = std::max(last, s.doneS);
        std::printf("{\"station\": %u, \"distance_m\": %.3f, \"snr_db\": %.3f, \"mcs\": %u, "
                    "\"time_s\": %.6f, \"bytes\": %llu, \"received\": %llu, "
                    "\"data_mpdus_by_mcs\": {%s}, \"retried_mpdus\": %llu}\n",
                    i,
                    s.distanceM,
                    s.snrCount ? s.snrDbSum / s.snrCount : NAN,
                    mcs,
                    s.doneS,
                    (unsigned long long)bytes,
                    (unsigned long long)s.received,
                    hist.str().c_str(),
                    (unsigned long long)s.retries);
    }
    std::printf("{\"summary\": {\"stations\": %u, \"bytes\": %llu, \"width_mhz\": %u, "
                "\"gi_ns\": %u, \"tx_power_dbm\": %.4f, \"noise_figure_db\": %.2f, "
                "\"p2p_rate\": \"%s\", \"p2p_delay_ms\": %.3f, \"tcp_buffer_bytes\": %u, "
                "\"min_rto_ms\": %.1f, \"del_ack_timeout_ms\": %.1f, \"hystart_delay_ms\": %.1f, "
                "\"seed\": %u, \"worst_pair_rx_dbm\": %.2f, \"last_time_s\": %.6f, "
                "\"all_done\": %s, \"ns3\": \"3.37\"}}\n",
                stations,
                (unsigned long long)bytes,
                channelWidthMhz,
                giNs,
                txPowerDbm,
                noiseFigureDb,
                p2pRate.c_str(),
                p2pDelayMs,
                tcpBufferBytes,
                minRtoMs,
                delAckTimeoutMs,
                hystartDelayMs,
                seed,
                worstPairDbm,
                last,
                g_done == stations ? "true" : "false");
    Simulator::Destroy();
    return 0;
}
