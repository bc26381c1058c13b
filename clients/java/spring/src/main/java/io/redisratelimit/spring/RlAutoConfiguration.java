package io.redisratelimit.spring;

import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.SmartInitializingSingleton;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.cloud.gateway.filter.GlobalFilter;
import org.springframework.cloud.gateway.support.ConfigurationService;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Primary;
import org.springframework.core.env.Environment;

/** Registers the RedisRateLimiter replacement and, with ratelimit.filter.enabled, the GlobalFilter. */
@AutoConfiguration(
    beforeName = "org.springframework.cloud.gateway.config.GatewayAutoConfiguration",
    afterName = {
        "org.springframework.boot.actuate.autoconfigure.metrics.CompositeMeterRegistryAutoConfiguration",
        "org.springframework.boot.micrometer.metrics.autoconfigure.CompositeMeterRegistryAutoConfiguration"})
@ConditionalOnClass(GlobalFilter.class)
@EnableConfigurationProperties(RlProperties.class)
public class RlAutoConfiguration {

    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    RlCommands rlCommands(RlProperties props) {
        return new RlCommands(props.getRedisUri(), props.getBreaker()::newBreaker);
    }

    /** Where the application has no registry (no actuator), one of the starter's own, so the counters exist. */
    @Bean
    @ConditionalOnMissingBean(MeterRegistry.class)
    SimpleMeterRegistry rlMeterRegistry() {
        return new SimpleMeterRegistry();
    }

    static MeterRegistry registry(ObjectProvider<MeterRegistry> registries) {
        return registries.getIfAvailable(SimpleMeterRegistry::new);
    }

    /** The default RateLimiter of every RequestRateLimiter filter: route config is untouched. */
    @Bean
    @Primary
    @ConditionalOnProperty(name = "ratelimit.rate-limiter.enabled", matchIfMissing = true)
    RlRateLimiter rlRateLimiter(RlCommands redis, ConfigurationService configurationService, RlProperties props,
                                ObjectProvider<MeterRegistry> registries) {
        return new RlRateLimiter(redis, configurationService, props.getTimeout(),
            props.getRateLimiter().isIncludeHeaders(), registry(registries), props.getRateLimiter().getKeyPattern());
    }

    /** Refuses at startup, naming the property, a route whose limiter arguments have no exact integer form. */
    @Bean
    @ConditionalOnProperty(name = "ratelimit.rate-limiter.enabled", matchIfMissing = true)
    SmartInitializingSingleton rlRateLimiterStartupCheck(Environment env) {
        return () -> StartupCheck.check(env);
    }

    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    RuleStore rlRuleStore(RlProperties props) {
        return new RuleStore(props);
    }

    @Bean
    @ConditionalOnProperty(name = "ratelimit.filter.enabled")
    RlGlobalFilter rlGlobalFilter(RlCommands redis, RuleStore rules, RlProperties props,
                                  ObjectProvider<MeterRegistry> registries) {
        return new RlGlobalFilter(redis, rules, props, registry(registries));
    }
}
