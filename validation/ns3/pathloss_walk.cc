// ns-3's TR 38.901 UMi-Street Canyon model along a walk, for mecsim's path loss
// (validation/pathloss_walk.py; docs/channel.md, "Checked against ns-3").
//
// A base station at (0, 0, 10 m) and a walker at (x, 0, 1.5 m), x = 20 .. 300 m.
// Prints one JSON object per line:
//   {"d_m": x, "los_fraction": f, "samples": n, "los_db": PL_LOS, "nlos_db": PL_NLOS}
//     every 10 m: the LOS fraction of n fresh devices at x under
//     ThreeGppUmiStreetCanyonChannelConditionModel, and
//     ThreeGppUmiStreetCanyonPropagationLossModel without shadowing under
//     AlwaysLos / NeverLos conditions
//   {"lag_m": L, "shadow_corr": r, "shadow_std_db": s, "walkers": n}
//     ns-3's shadowing along the walk (LOS, 1 m steps, its correlated update
//     R = exp(-displacement / 10 m)): the correlation over walkers of the shadowing at
//     x and x + L, pooled over x, and its standard deviation.
#include "ns3/channel-condition-model.h"
#include "ns3/core-module.h"
#include "ns3/mobility-module.h"
#include "ns3/network-module.h"
#include "ns3/three-gpp-propagation-loss-model.h"

#include <cmath>
#include <cstdio>
#include <vector>

using namespace ns3;

static Ptr<MobilityModel>
Place(Ptr<Node> node, double x, double y, double z)
{
    Ptr<ConstantPositionMobilityModel> m = CreateObject<ConstantPositionMobilityModel>();
    m->SetPosition(Vector(x, y, z));
    node->AggregateObject(m);
    return m;
}

int
main(int argc, char* argv[])
{
    uint32_t walkers = 2000;
    uint32_t samples = 4000;
    uint32_t seed = 1;
    CommandLine cmd;
    cmd.AddValue("walkers", "walkers for the shadowing statistics", walkers);
    cmd.AddValue("samples", "devices per distance for the LOS fraction", samples);
    cmd.AddValue("seed", "RngRun", seed);
    cmd.Parse(argc, argv);
    RngSeedManager::SetSeed(1);
    RngSeedManager::SetRun(seed);

    const double fc = 3.5e9;
    Ptr<Node> bsNode = CreateObject<Node>();
    Ptr<MobilityModel> bs = Place(bsNode, 0.0, 0.0, 10.0);
    Ptr<Node> ueNode = CreateObject<Node>();
    Ptr<MobilityModel> ue = Place(ueNode, 20.0, 0.0, 1.5);

    Ptr<ThreeGppUmiStreetCanyonChannelConditionModel> cond =
        CreateObject<ThreeGppUmiStreetCanyonChannelConditionModel>();
    cond->AssignStreams(2000);
    Ptr<ThreeGppUmiStreetCanyonPropagationLossModel> los =
        CreateObject<ThreeGppUmiStreetCanyonPropagationLossModel>();
    los->SetAttribute("Frequency", DoubleValue(fc));
    los->SetAttribute("ShadowingEnabled", BooleanValue(false));
    los->SetChannelConditionModel(CreateObject<AlwaysLosChannelConditionModel>());
    Ptr<ThreeGppUmiStreetCanyonPropagationLossModel> nlos =
        CreateObject<ThreeGppUmiStreetCanyonPropagationLossModel>();
    nlos->SetAttribute("Frequency", DoubleValue(fc));
    nlos->SetAttribute("ShadowingEnabled", BooleanValue(false));
    nlos->SetChannelConditionModel(CreateObject<NeverLosChannelConditionModel>());

    for (int x = 20; x <= 300; x += 10)
    {
        ue->SetPosition(Vector(x, 0.0, 1.5));
        // the LOS fraction of fresh devices at this distance (each pair drawn once)
        uint32_t losCount = 0;
        for (uint32_t k = 0; k < samples; ++k)
        {
            Ptr<Node> node = CreateObject<Node>();
            Ptr<MobilityModel> m = Place(node, x, 0.0, 1.5);
            if (cond->GetChannelCondition(m, bs)->IsLos())
            {
                ++losCount;
            }
        }
        std::printf("{\"d_m\": %d, \"los_fraction\": %.12g, \"samples\": %u, "
                    "\"los_db\": %.12g, \"nlos_db\": %.12g}\n",
                    x,
                    double(losCount) / samples,
                    samples,
                    -los->CalcRxPower(0.0, ue, bs),
                    -nlos->CalcRxPower(0.0, ue, bs));
    }

    // shadowing along the walk: one model with shadowing, one walker node after another
    Ptr<ThreeGppUmiStreetCanyonPropagationLossModel> shadowed =
        CreateObject<ThreeGppUmiStreetCanyonPropagationLossModel>();
    shadowed->SetAttribute("Frequency", DoubleValue(fc));
    shadowed->SetChannelConditionModel(CreateObject<AlwaysLosChannelConditionModel>());
    shadowed->AssignStreams(1000);
    const int steps = 281; // x = 20 .. 300 m, 1 m apart
    std::vector<std::vector<double>> sf(walkers, std::vector<double>(steps));
    for (uint32_t w = 0; w < walkers; ++w)
    {
        Ptr<Node> node = CreateObject<Node>();
        Ptr<MobilityModel> walker = Place(node, 20.0, 0.0, 1.5);
        for (int k = 0; k < steps; ++k)
        {
            walker->SetPosition(Vector(20.0 + k, 0.0, 1.5));
            double mean = -los->CalcRxPower(0.0, walker, bs);
            sf[w][k] = -shadowed->CalcRxPower(0.0, walker, bs) - mean;
        }
    }
    const int lags[] = {1, 5, 10, 20, 30};
    for (int lag : lags)
    {
        double sxy = 0, sxx = 0, syy = 0;
        long n = 0;
        for (uint32_t w = 0; w < walkers; ++w)
        {
            for (int k = 40; k + lag < steps; k += 40) // from 60 m: the first update is off
            {
                sxy += sf[w][k] * sf[w][k + lag];
                sxx += sf[w][k] * sf[w][k];
                syy += sf[w][k + lag] * sf[w][k + lag];
                ++n;
            }
        }
        std::printf("{\"lag_m\": %d, \"shadow_corr\": %.6g, \"shadow_std_db\": %.6g, "
                    "\"walkers\": %u, \"pairs\": %ld}\n",
                    lag,
                    sxy / std::sqrt(sxx * syy),
                    std::sqrt(sxx / n),
                    walkers,
                    n);
    }
    Simulator::Destroy();
    return 0;
}
