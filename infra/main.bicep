// TableCatalog as an Azure Functions custom-handler app on the Flex Consumption plan (Linux).
//
// Deploy into an existing resource group:
//   az deployment group create -g <rg> -f infra/main.bicep -p infra/main.parameters.json
// then publish the package built by scripts/package.sh (see docs/FUNCTIONS.md, "Deploy").
//
// Why Flex Consumption: Linux Consumption (Y1) retires on 2028-09-30 and gets no new features;
// Flex Consumption is its Linux successor, scales to zero, and lists a "custom" runtime
// (functionAppConfig.runtime name 'custom', version '1.0'). Sources in docs/FUNCTIONS.md.
//
// Check that the region offers Flex Consumption and the custom runtime first (an empty list
// means it does not):
//   az functionapp list-flexconsumption-runtimes --location <region> --runtime custom
//
// Storage access is keyless: Shared Key access is off (allowSharedKeyAccess: false) and no app
// setting holds a key or a connection string. The Functions host (queue trigger, timer locks,
// deployment package) and the table-catalog binary (tables, apply queue) both use the
// user-assigned managed identity through the AzureWebJobsStorage__* settings (service URIs,
// credential, clientId), as Microsoft's Flex Consumption samples set them, with the roles
// Storage Blob Data Owner, Storage Queue Data Contributor and Storage Table Data Contributor on
// the account. The binary gets its tokens from the app's managed-identity endpoint
// (IDENTITY_ENDPOINT/IDENTITY_HEADER, set by the platform).
//
// Names: the app settings, tables and queues below are derived from `catalogName` exactly as
// the binary derives its defaults (src/settings.rs); tests/functions_assets.rs checks both.

targetScope = 'resourceGroup'

@description('Region of every resource. Flex Consumption is available in a subset of regions.')
param location string = resourceGroup().location

@description('Prefix of resource names: 3-10 lowercase letters or digits (it starts the storage account name, which allows nothing else).')
@minLength(3)
@maxLength(10)
param namePrefix string = 'tcat'

@description('Catalog table name (TABLE_CATALOG_NAME): letters and digits, starting with a letter. The WAL table ({name}wal), apply queue ({name}-apply, lowercased) and poison queue ({queue}-poison) derive from it; queue names are limited to 63 characters ({name}-apply-scan-poison), hence 45.')
@minLength(3)
@maxLength(45)
param catalogName string = 'catalog'

@description('Comma-separated indexed fields (TABLE_CATALOG_INDEX_KEYS), e.g. eid,ssn,npi.')
param indexKeys string

@description('Field whose value starts the RowKey (TABLE_CATALOG_ROW_KEY).')
param rowKey string

@description('The catalog mode (TABLE_CATALOG_MODE), chosen when the catalog is created: empty or wal for the write-ahead-log mode, single-partition for every row in the partition catalogTenant with each write one entity group transaction (README.md, Choosing a mode).')
param catalogMode string = ''

@description('The tenant key of a single-partition catalog (TABLE_CATALOG_TENANT): the PartitionKey of its rows. Empty in WAL mode.')
param catalogTenant string = ''

@description('Index fields keyed by an HMAC-SHA-256 of their value instead of the value (TABLE_CATALOG_HASHED_KEYS), comma-separated, e.g. ssn. Empty: none. Needs hashKeyVaultName and hashKeySecretName.')
param hashedKeys string = ''

@description('Hashed fields that records hold as hmac-sha256:<hex> instead of the value (TABLE_CATALOG_REDACT_KEYS), a subset of hashedKeys. Empty: none.')
param redactKeys string = ''

@description('Key Vault (in this resource group) holding the HMAC secret of hashed fields. Empty: no secret (no hashed fields). The app identity gets Key Vault Secrets User on it.')
param hashKeyVaultName string = ''

@description('Name of the secret in hashKeyVaultName: at least 32 random bytes as base64 or hex, e.g. az keyvault secret set --vault-name <vault> -n catalog-hash-key --value "$(openssl rand -base64 32)".')
param hashKeySecretName string = 'catalog-hash-key'

@description('WAL shards new writes are spread over (TABLE_CATALOG_WAL_SHARDS), 1-64. The catalog keeps the largest count it was ever opened with, so raise it, never lower it. 4 suits up to about 800 writes/s; 8 or 16 above.')
@minValue(1)
@maxValue(64)
param walShards int = 4

@description('Flex Consumption maximumInstanceCount (1-1000): the most on-demand instances of each function group (the HTTP functions together; apply, scan and sweep each on their own), not of the whole app. Appliers of one WAL shard serialise on its lease, so apply instances beyond walShards add no apply throughput; the HTTP group (writes) is what a higher value scales. Default 40, accepted in every region; lower it to cap storage load where the region accepts values below 40 (docs/FUNCTIONS.md, section 6).')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Memory of each Flex Consumption instance, in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Days of log retention in the Log Analytics workspace.')
@minValue(30)
@maxValue(730)
param logRetentionDays int = 30

// ---- Names (must agree with src/settings.rs defaults, host.json and functions/*) ----------

var token = uniqueString(resourceGroup().id, namePrefix)
// namePrefix check: Bicep has no pattern decorator, so strip the allowed characters
// [a-z0-9] and expect nothing left; otherwise the storage account gets a name that fails
// validation and says why.
var prefixAllowed = 'abcdefghijklmnopqrstuvwxyz0123456789'
var prefixInvalidChars = reduce(
  map(range(0, length(prefixAllowed)), i => substring(prefixAllowed, i, 1)),
  namePrefix,
  (rest, c) => replace(rest, c, '')
)
var storageAccountName = empty(prefixInvalidChars)
  ? take('${namePrefix}${token}', 24)
  : 'namePrefix-must-be-lowercase-letters-or-digits'

var functionAppName = '${namePrefix}-func-${token}'
var planName = '${namePrefix}-plan-${token}'
var identityName = '${namePrefix}-id-${token}'
var logAnalyticsName = '${namePrefix}-logs-${token}'
var appInsightsName = '${namePrefix}-ai-${token}'
var deploymentContainerName = 'app-package'

var catalogTableName = catalogName
var walTableName = '${catalogName}wal'
var applyQueueName = toLower('${catalogName}-apply')
var poisonQueueName = '${applyQueueName}-poison'
var scanQueueName = '${applyQueueName}-scan'
var scanPoisonQueueName = '${scanQueueName}-poison'

// Built-in role definition ids.
var roleStorageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var roleStorageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
var roleStorageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var roleMonitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'
var roleKeyVaultSecretsUser = '4633458b-17de-408a-b874-0445c86b69e6'

// TABLE_CATALOG_HASH_KEY: a Key Vault reference, which the Functions host resolves with the
// app's identity (keyVaultReferenceIdentity) and passes to the binary as the secret's value.
// The secret itself is never in the template, its parameters or the app settings.
var hashKeyReference = empty(hashKeyVaultName) ? '' : '@Microsoft.KeyVault(VaultName=${hashKeyVaultName};SecretName=${hashKeySecretName})'

// ---- Storage: catalog + WAL tables, apply + poison queues, deployment container ----------

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageAccountName
  location: location
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    allowBlobPublicAccess: false
    // Keyless: every client (host and binary) uses the managed identity.
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    publicNetworkAccess: 'Enabled'
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource catalogTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: catalogTableName
}

resource walTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: walTableName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource applyQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: applyQueueName
}

resource poisonQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: poisonQueueName
}

// Job work items (verify, repair, rebuild, trim-history, and the backfill and drop-index jobs
// of online index changes) for the `scan` function, and their poison queue.
resource scanQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: scanQueueName
}

resource scanPoisonQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: scanPoisonQueueName
}

// ---- Monitoring ------------------------------------------------------------------------

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: logRetentionDays
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    // Telemetry is sent with the managed identity (APPLICATIONINSIGHTS_AUTHENTICATION_STRING).
    DisableLocalAuth: true
  }
}

// ---- Identity and role assignments -------------------------------------------------------

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: identityName
  location: location
}

// Deployment package (Flex deployment container) and the host's blob leases (timer singleton).
resource blobOwnerRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, identity.id, roleStorageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleStorageBlobDataOwner)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// Queue trigger: read, update visibility, delete; create and write the poison queue.
resource queueContributorRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, identity.id, roleStorageQueueDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleStorageQueueDataContributor)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// The catalog and WAL tables (the binary) and the host's table endpoint.
resource tableContributorRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, identity.id, roleStorageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleStorageTableDataContributor)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource metricsPublisherRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, identity.id, roleMonitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleMonitoringMetricsPublisher)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// Reads the HMAC secret of hashed fields (only when a vault is given).
resource hashKeyVault 'Microsoft.KeyVault/vaults@2023-07-01' existing = if (!empty(hashKeyVaultName)) {
  name: hashKeyVaultName
}

resource hashKeySecretsUserRole 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(hashKeyVaultName)) {
  name: guid(resourceGroup().id, hashKeyVaultName, identity.id, roleKeyVaultSecretsUser)
  scope: hashKeyVault
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleKeyVaultSecretsUser)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// ---- Function App on Flex Consumption ------------------------------------------------------

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: functionAppName
  location: location
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // Key Vault references (TABLE_CATALOG_HASH_KEY) are resolved with the user-assigned identity.
    keyVaultReferenceIdentity: identity.id
    siteConfig: {
      minTlsVersion: '1.2'
      // Flex Consumption rejects FUNCTIONS_WORKER_RUNTIME and FUNCTIONS_EXTENSION_VERSION:
      // the runtime is functionAppConfig.runtime below.
      appSettings: [
        {
          name: 'AzureWebJobsStorage__credential'
          value: 'managedidentity'
        }
        {
          name: 'AzureWebJobsStorage__clientId'
          value: identity.properties.clientId
        }
        {
          name: 'AzureWebJobsStorage__blobServiceUri'
          value: storage.properties.primaryEndpoints.blob
        }
        {
          name: 'AzureWebJobsStorage__queueServiceUri'
          value: storage.properties.primaryEndpoints.queue
        }
        {
          name: 'AzureWebJobsStorage__tableServiceUri'
          value: storage.properties.primaryEndpoints.table
        }
        {
          name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
          value: appInsights.properties.ConnectionString
        }
        {
          name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
          value: 'ClientId=${identity.properties.clientId};Authorization=AAD'
        }
        {
          name: 'TABLE_CATALOG_NAME'
          value: catalogTableName
        }
        {
          name: 'TABLE_CATALOG_INDEX_KEYS'
          value: indexKeys
        }
        {
          name: 'TABLE_CATALOG_ROW_KEY'
          value: rowKey
        }
        {
          name: 'TABLE_CATALOG_WAL_NAME'
          value: walTableName
        }
        {
          name: 'TABLE_CATALOG_QUEUE'
          value: applyQueueName
        }
        {
          name: 'TABLE_CATALOG_SCAN_QUEUE'
          value: scanQueueName
        }
        {
          name: 'TABLE_CATALOG_WAL_SHARDS'
          value: string(walShards)
        }
        {
          name: 'TABLE_CATALOG_MODE'
          value: catalogMode
        }
        {
          name: 'TABLE_CATALOG_TENANT'
          value: catalogTenant
        }
        {
          name: 'TABLE_CATALOG_HASHED_KEYS'
          value: hashedKeys
        }
        {
          name: 'TABLE_CATALOG_REDACT_KEYS'
          value: redactKeys
        }
        {
          name: 'TABLE_CATALOG_HASH_KEY'
          value: hashKeyReference
        }
      ]
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identity.id
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'custom'
        version: '1.0'
      }
    }
  }
  // The host reaches storage with the identity as soon as it starts: roles first.
  dependsOn: [
    blobOwnerRole
    queueContributorRole
    tableContributorRole
    metricsPublisherRole
    hashKeySecretsUserRole
    deploymentContainer
    catalogTable
    walTable
    applyQueue
    poisonQueue
    scanQueue
    scanPoisonQueue
  ]
}

output functionAppName string = functionApp.name
output functionAppHostName string = functionApp.properties.defaultHostName
output storageAccountName string = storage.name
output deploymentContainerUrl string = '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
output catalogTable string = catalogTable.name
output walTable string = walTable.name
output applyQueue string = applyQueue.name
output poisonQueue string = poisonQueue.name
output scanQueue string = scanQueue.name
