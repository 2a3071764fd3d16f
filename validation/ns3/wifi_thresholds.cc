// Prints the SNR thresholds ns-3's IdealWifiManager uses for HE (802.11ax) MCSs.
//
// IdealWifiManager::BuildSnrThresholds (ns-3.37) computes, for every HE MCS, every
// channel width from 20 MHz up to the PHY's and every NSS the MCS allows,
// WifiPhy::CalculateSnr(txVector, BerThreshold) with BerThreshold = 1e-6: a bisection on
// the PHY's error-rate model for the SNR at which 1 - ChunkSuccessRate(1 bit) <= 1e-6.
// This program builds the same PHY as validation/ns3/wifi_cell.cc (YansWifiPhyHelper:
// TableBasedErrorRateModel, YansErrorRateModel as its fallback), configured for 160 MHz
// and 4 antennas, and asks that PHY the same question, so the numbers are ns-3's own.
// The rate manager selects the fastest (MCS, NSS) whose threshold is strictly below the
// observed SNR (scaled by width/observed width and nss/observed nss).
//
// One JSON line per (mcs, width, nss): snr threshold (linear and dB), and ns-3's data rate
// for GI 800/1600/3200 ns (a cross-check of the rate table in channel/phy.py).
//
// Build: g++ -O2 -std=c++17 wifi_thresholds.cc $(pkg-config --cflags --libs ns3-core
//   ns3-network ns3-wifi ns3-mobility ns3-propagation) -o /tmp/wifi_thresholds
#include "ns3/core-module.h"
#include "ns3/mobility-module.h"
#include "ns3/network-module.h"
#include "ns3/wifi-module.h"

#include <cmath>
#include <cstdio>

using namespace ns3;

int
main(int argc, char* argv[])
{
    double ber = 1e-6;
    CommandLine cmd;
    cmd.AddValue("ber", "BER threshold (IdealWifiManager::BerThreshold)", ber);
    cmd.Parse(argc, argv);

    NodeContainer node;
    node.Create(1);
    YansWifiChannelHelper channel = YansWifiChannelHelper::Default();
    YansWifiPhyHelper phy;
    phy.SetChannel(channel.Create());
    phy.Set("ChannelSettings", StringValue("{0, 160, BAND_5GHZ, 0}"));
    phy.Set("Antennas", UintegerValue(4));
    phy.Set("MaxSupportedTxSpatialStreams", UintegerValue(4));
    phy.Set("MaxSupportedRxSpatialStreams", UintegerValue(4));
    WifiHelper wifi;
    wifi.SetStandard(WIFI_STANDARD_80211ax);
    wifi.SetRemoteStationManager("ns3::IdealWifiManager");
    WifiMacHelper mac;
    mac.SetType("ns3::AdhocWifiMac");
    NetDeviceContainer dev = wifi.Install(phy, mac, node);
    MobilityHelper mobility;
    mobility.Install(node);
    Ptr<WifiPhy> wifiPhy = DynamicCast<WifiNetDevice>(dev.Get(0))->GetPhy();

    for (const auto& mode : wifiPhy->GetMcsList(WIFI_MOD_CLASS_HE))
    {
        for (uint16_t width = 20; width <= 160; width *= 2)
        {
            for (uint8_t nss = 1; nss <= 4; nss++)
            {
                if (!mode.IsAllowed(width, nss))
                {
                    continue;
                }
                WifiTxVector txVector;
                txVector.SetMode(mode);
                txVector.SetChannelWidth(width);
                txVector.SetNss(nss);
                txVector.SetGuardInterval(800);
                txVector.SetPreambleType(WIFI_PREAMBLE_HE_SU);
                double snr = wifiPhy->CalculateSnr(txVector, ber);
                std::printf("{\"mcs\": %u, \"channel_width_mhz\": %u, \"nss\": %u, "
                            "\"snr_threshold\": %.9g, \"snr_threshold_db\": %.6f, "
                            "\"rate_bps_gi800\": %llu, \"rate_bps_gi1600\": %llu, "
                            "\"rate_bps_gi3200\": %llu}\n",
                            mode.GetMcsValue(),
                            width,
                            nss,
                            snr,
                            10.0 * std::log10(snr),
                            (unsigned long long)mode.GetDataRate(width, 800, nss),
                            (unsigned long long)mode.GetDataRate(width, 1600, nss),
                            (unsigned long long)mode.GetDataRate(width, 3200, nss));
            }
        }
    }
    Simulator::Destroy();
    return 0;
}
