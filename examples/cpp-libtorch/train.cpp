// co2 example: a LibTorch training loop that hands its parameters to the C API.
//
// A small MLP classifies points of a synthetic 4-class problem (a fixed random "teacher"
// network labels Gaussian inputs). Every rank owns a shard of the data. The model's parameters
// are copied into one flat fp32 tensor that the program allocates and co2 adopts
// (co2_engine_adopt_flat + one segment per parameter); each parameter becomes a view into it,
// so torch::optim::SGD and co2 work on the same memory. After every optimizer step the loop
// calls co2_engine_step; under `sync` it first averages the gradients (passed on every call).
//
// Ranks: with RANK and WORLD_SIZE in the environment (co2run, torchrun) this process is one rank
// and the transport is AUTO; otherwise --ranks N threads of this process form a group over the
// in-process `local` transport.
//
// Usage: co2_example_libtorch [--algorithm co2|sync|localsgd|diloco] [--ranks N] [--rounds N]
//                             [--tau N] [--outer-lr ALPHA]
// Exit status: 0 when the held-out accuracy of the final consensus model beats chance by a wide
// margin (>= 0.75 for 4 classes), 1 on any co2 error, 2 when it does not.
#include <co2/co2.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

void check(co2_status_t status, const char *call) {
    if (status == CO2_OK) return;
    const char *detail = co2_last_error_message();  // valid until the next co2 call
    std::fprintf(stderr, "error: %s: %s\n  detail: %s\n", call, co2_status_string(status), detail);
    std::fflush(nullptr);
    std::_Exit(1);  // other ranks may be blocked in a collective
}
#define CO2_CHECK(call) check((call), #call)  // glog (under torch) owns CHECK

constexpr int kFeatures = 16, kClasses = 4, kHidden = 32, kBatch = 32;
constexpr int kTrainPerRank = 2048, kTest = 1024;
// Every algorithm reaches about 0.86 in the default 40 rounds; chance is 0.25.
constexpr double kPassAccuracy = 0.75;

struct Options {
    co2_algorithm_t algorithm = CO2_ALGO_CO2;
    int ranks = 4, rounds = 40, tau = 4;
    // co2's one-round-stale update with the C default alpha = 1 oscillates with this inner
    // optimizer (SGD, momentum 0.9); alpha = 0.5 is stable (see examples/python/README.md).
    double outer_lr = 0.5;
};

// The data set is the same in every rank (fixed seed); rank r trains on rows [r*n, (r+1)*n).
struct Data {
    torch::Tensor train_x, train_y, test_x, test_y;
};

Data make_data(int world) {
    torch::manual_seed(1234);
    auto teacher = torch::randn({kFeatures, kClasses});
    auto label = [&](const torch::Tensor &x) { return torch::tanh(x).matmul(teacher).argmax(1); };
    Data d;
    d.train_x = torch::randn({kTrainPerRank * world, kFeatures});
    d.train_y = label(d.train_x);
    d.test_x = torch::randn({kTest, kFeatures});
    d.test_y = label(d.test_x);
    return d;
}

double accuracy(torch::nn::Sequential &model, const torch::Tensor &x, const torch::Tensor &y) {
    torch::NoGradGuard no_grad;
    return model->forward(x).argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
}

double run_rank(const Options &opt, const Data &data, int rank, int world, co2_comm_t comm) {
    torch::manual_seed(100 + rank);  // different initial weights per rank: commit broadcasts 0's
    torch::nn::Sequential model(torch::nn::Linear(kFeatures, kHidden), torch::nn::ReLU(),
                                torch::nn::Linear(kHidden, kClasses));

    // Flat storage the program allocates and co2 adopts; parameters become views into it.
    std::vector<torch::Tensor> params = model->parameters();
    int64_t total = 0;
    for (auto &p : params) total += p.numel();
    auto flat = torch::zeros({total}, torch::kFloat32);
    co2_engine_config_t config = CO2_ENGINE_CONFIG_INIT;
    config.algorithm = opt.algorithm;
    config.tau = static_cast<uint32_t>(opt.tau);
    config.outer_lr = opt.outer_lr;
    co2_engine_t engine;
    CO2_CHECK(co2_engine_create(comm, &config, &engine));
    CO2_CHECK(co2_engine_adopt_flat(engine, flat.data_ptr<float>(), static_cast<size_t>(total),
                                CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
    auto named = model->named_parameters();
    int64_t offset = 0;
    for (auto &item : named) {
        torch::Tensor &p = item.value();
        const int64_t n = p.numel();
        auto view = flat.narrow(0, offset, n).view(p.sizes());
        view.copy_(p.detach());
        p.set_data(view);
        co2_segment_t segment = CO2_SEGMENT_INIT;
        segment.name = item.key().c_str();
        segment.offset = static_cast<size_t>(offset);
        segment.count = static_cast<size_t>(n);
        CO2_CHECK(co2_engine_add_segment(engine, &segment));
        offset += n;
    }
    CO2_CHECK(co2_engine_commit(engine));  // every rank now holds rank 0's initial weights

    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto x = data.train_x.narrow(0, rank * kTrainPerRank, kTrainPerRank);
    auto y = data.train_y.narrow(0, rank * kTrainPerRank, kTrainPerRank);
    const int steps = opt.rounds * opt.tau;
    std::vector<void *> grads(named.size());
    for (int step = 0; step < steps; ++step) {
        const int64_t start = (step * kBatch) % kTrainPerRank;
        sgd.zero_grad();  // LibTorch, like PyTorch 2, may reallocate gradients: pass them each time
        auto loss = torch::nn::functional::cross_entropy(model->forward(x.narrow(0, start, kBatch)),
                                                         y.narrow(0, start, kBatch));
        loss.backward();
        if (opt.algorithm == CO2_ALGO_SYNC) {
            for (size_t i = 0; i < named.size(); ++i) {
                torch::Tensor g = named[i].value().grad();
                grads[i] = g.defined() ? g.data_ptr<float>() : nullptr;
            }
            CO2_CHECK(co2_engine_reduce_gradients(engine, grads.data(), grads.size(), nullptr));
        }
        sgd.step();
        int boundary = 0;
        CO2_CHECK(co2_engine_step(engine, nullptr, &boundary));
        if (boundary && rank == 0 && (step + 1) % (opt.tau * 10) == 0)
            std::printf("round %4d  loss %.4f\n", (step + 1) / opt.tau, loss.item<double>());
    }
    CO2_CHECK(co2_engine_finalize(engine));  // parameters = the common model on every rank
    const double acc = accuracy(model, data.test_x, data.test_y);
    co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
    CO2_CHECK(co2_engine_get_stats(engine, &stats));
    if (rank == 0)
        std::printf("rank 0 of %d: %llu steps, %llu rounds, waited %.3f ms at boundaries, "
                    "held-out accuracy %.3f\n",
                    world, static_cast<unsigned long long>(stats.steps),
                    static_cast<unsigned long long>(stats.rounds), stats.boundary_wait_ns / 1e6,
                    acc);
    CO2_CHECK(co2_engine_destroy(engine));  // before `flat`, which it adopted, goes away
    return acc;
}

co2_algorithm_t parse_algorithm(const std::string &name) {
    if (name == "co2") return CO2_ALGO_CO2;
    if (name == "sync") return CO2_ALGO_SYNC;
    if (name == "localsgd") return CO2_ALGO_LOCALSGD;
    if (name == "diloco") return CO2_ALGO_DILOCO;
    std::fprintf(stderr, "unknown algorithm '%s' (co2, sync, localsgd, diloco)\n", name.c_str());
    std::exit(1);
}

}  // namespace

int main(int argc, char **argv) {
    Options opt;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string key = argv[i], value = argv[i + 1];
        if (key == "--algorithm") opt.algorithm = parse_algorithm(value);
        else if (key == "--ranks") opt.ranks = std::atoi(value.c_str());
        else if (key == "--rounds") opt.rounds = std::atoi(value.c_str());
        else if (key == "--tau") opt.tau = std::atoi(value.c_str());
        else if (key == "--outer-lr") opt.outer_lr = std::atof(value.c_str());
        else { std::fprintf(stderr, "unknown option %s\n", key.c_str()); return 1; }
    }
    if (opt.ranks < 1 || opt.rounds < 1 || opt.tau < 1) {
        std::fprintf(stderr, "--ranks, --rounds and --tau must be >= 1\n");
        return 1;
    }
    torch::set_num_threads(1);  // ranks share the cores; one intra-op thread each

    const char *env_rank = std::getenv("RANK"), *env_world = std::getenv("WORLD_SIZE");
    double acc = 0.0;
    if (env_rank && env_world) {  // one rank per process (co2run, torchrun)
        co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
        cc.rank = std::atoi(env_rank);
        cc.world_size = std::atoi(env_world);
        co2_comm_t comm;
        CO2_CHECK(co2_comm_create(&cc, &comm));
        acc = run_rank(opt, make_data(cc.world_size), cc.rank, cc.world_size, comm);
        CO2_CHECK(co2_comm_destroy(comm));
    } else {  // ranks are threads of this process
        const Data data = make_data(opt.ranks);
        std::vector<double> accs(opt.ranks);
        std::vector<std::thread> threads;
        for (int r = 0; r < opt.ranks; ++r)
            threads.emplace_back([&, r] {
                co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
                cc.transport = CO2_TRANSPORT_LOCAL;
                cc.rank = r;
                cc.world_size = opt.ranks;
                cc.group_name = "libtorch-example";
                co2_comm_t comm;
                CO2_CHECK(co2_comm_create(&cc, &comm));
                accs[r] = run_rank(opt, data, r, opt.ranks, comm);
                CO2_CHECK(co2_comm_destroy(comm));
            });
        for (auto &t : threads) t.join();
        for (int r = 1; r < opt.ranks; ++r)
            if (accs[r] != accs[0]) {
                std::fprintf(stderr, "ranks disagree after finalize: %.6f vs %.6f\n", accs[r],
                             accs[0]);
                return 2;
            }
        acc = accs[0];
    }
    return acc >= kPassAccuracy ? 0 : 2;
}
